"""`pack build` as a supervised child process: Ctrl-C, SIGTERM and SIGHUP stop it at once, and every way
it can end leaves no partial package or temporary file behind.

A Python signal handler runs only between bytecodes, so a build inside TVM's or LLVM's C++ code
(seconds to minutes per call) cannot react to Ctrl-C in time, and a process that LLVM ends with
`exit(1)` on a failed write, or the kernel kills for memory, runs no cleanup of its own. So the
build runs in a forked child, in its own process group, with its temporary files under one
folder of the parent's (TMPDIR). The child records each staged package folder it creates (and a
package it moved aside while replacing it) in a list file; whatever happens to the child, the
parent kills what is left of its process group, removes what the list names, puts a moved-aside
package back, and removes the temporary folder.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable

from .errors import LOW_SPACE_BYTES

LIST_ENV = "PACKAGER_STAGED_LIST"          # the child appends tab-separated lines here (see record)
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def record(kind: str, *args: object) -> None:
    """Tell the supervising parent (if any) what to undo should this process end before finishing
    the package: a folder to remove ("staged PATH"), a parent folder it made ("made PATH", removed
    if empty), a package moved aside to be put back ("moved OLD DEST"); or that it ended normally
    ("ended CODE")."""
    name = os.environ.get(LIST_ENV)
    if name:
        with open(name, "a") as f:
            f.write("\t".join([kind, *(str(a) for a in args)]) + "\n")


def supervised(work: Callable[[], int], err: Callable[[str], None]) -> int:
    """Run `work` (returns an exit code) in a child process; returns the exit code to use."""
    root = Path(tempfile.mkdtemp(prefix="pack-build-"))
    listing = root / "staged.txt"
    listing.touch()
    stopped: list[int] = []
    child: list[int] = []

    def stop(signum, _frame) -> None:
        stopped.append(signum)
        if child:
            _kill_group(child[0])

    previous = {s: signal.signal(s, stop) for s in EXIT_SIGNAL}   # before the fork: no signal is missed
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                   # the child: its own group, temp files under root
        os.setpgid(0, 0)
        for s in EXIT_SIGNAL:
            signal.signal(s, signal.SIG_DFL)
        tmp = root / "tmp"
        tmp.mkdir()
        os.environ.update(TMPDIR=str(tmp), **{LIST_ENV: str(listing)})
        tempfile.tempdir = str(tmp)
        code = 1
        try:
            code = work()
            record("ended", code)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)
    except OSError:                                # the child already did (or already ended)
        pass
    child.append(pid)
    if stopped:                                    # a signal came while forking
        _kill_group(pid)
    try:
        status = _wait(pid)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _kill_group(pid)                           # compilers or workers the child left running
        ended, folders = _clean(listing)
        folders.append(root.parent)
        shutil.rmtree(root, ignore_errors=True)
    if stopped:
        err("interrupted: the build was stopped; nothing was written")
        return EXIT_SIGNAL[stopped[0]]
    if ended is not None:
        return ended
    how = (f"exit status {os.WEXITSTATUS(status)}" if os.WIFEXITED(status)
           else f"signal {signal.Signals(os.WTERMSIG(status)).name}")
    full = [str(f) for f in folders if _low_space(f)]
    if full:
        err(f"error: the build process ended abruptly ({how}) with no space left on {', '.join(full)}; "
            "nothing was written; free space there or choose another --output")
        return 2
    err(f"internal error: the build process ended abruptly ({how}); nothing was written")
    return 1


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _clean(listing: Path) -> tuple[int | None, list[Path]]:
    """Remove the staged folders the child recorded and put back a package it had moved aside;
    returns the exit code the child recorded on ending normally (None if it did not) and the
    folders it was writing to."""
    ended, folders = None, []
    for line in reversed(listing.read_text().splitlines()):
        kind, *args = line.split("\t")
        if kind == "ended":
            ended = int(args[0])
        elif kind == "staged":
            shutil.rmtree(args[0], ignore_errors=True)
            folders.append(Path(args[0]).parent)
        elif kind == "made":                       # a parent folder the writer created: only if empty
            try:
                os.rmdir(args[0])
            except OSError:
                pass
        elif kind == "moved" and os.path.isdir(args[0]):
            if os.path.exists(args[1]):
                shutil.rmtree(args[0], ignore_errors=True)
            else:
                os.rename(args[0], args[1])
    return ended, folders


def _low_space(folder: Path) -> bool:
    try:
        fs = os.statvfs(folder)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES
