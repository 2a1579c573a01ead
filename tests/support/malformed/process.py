"""Running one variant's process: its own session (a hang is killed with everything it started)."""
from __future__ import annotations

import os
import signal
import subprocess
import time


def spawn(cmd: list[str], timeout: float, env: dict | None = None, preexec_fn=None):
    """(returncode or None on timeout, stderr, seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
                         preexec_fn=preexec_fn)
    try:
        _, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        rc = None
    return rc, err.decode("utf-8", "replace"), time.monotonic() - t0
