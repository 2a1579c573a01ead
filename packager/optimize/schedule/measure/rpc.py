"""Timing on a board behind a TVM RPC tracker (`targets[i].rpc`): the build host compiles each
batch of candidates (cross-compiled for the board's architecture), uploads the library, and
times it there with TVM's time evaluator, so an ARM board or a Jetson's CPU measures what the
build host cannot. One session per device per build process; a tracker that cannot be reached or
a key no server registered is a one-line error naming the spec field."""
from __future__ import annotations

import socket
import tempfile
import uuid
from pathlib import Path

from ....errors import UserError
from ....targets import RpcDevice, Target, Toolchain, host_arch

CONNECT_TIMEOUT_S = 5.0
_SESSIONS: dict[tuple[str, int, str], object] = {}


def _fail(dev: RpcDevice, msg: str) -> UserError:
    return UserError(f"{dev.where or 'rpc'}: {dev.describe()}: {msg}")


def _probe(dev: RpcDevice) -> None:
    """TVM's client retries a refused connection for a minute; answer at once instead."""
    try:
        socket.create_connection((dev.host, dev.port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise _fail(dev, f"cannot reach the tracker ({e.strerror or e}); start one with "
                    f"`python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port {dev.port}` (needs tornado) "
                    "or remove the target's rpc entry") from None


def session(dev: RpcDevice):
    """The RPC session to `dev` (opened once per process, kept for the build's later kernels)."""
    ident = (dev.host, dev.port, dev.key)
    if ident in _SESSIONS:
        return _SESSIONS[ident]
    from tvm import rpc

    _probe(dev)
    tracker = rpc.connect_tracker(dev.host, dev.port)
    keys = sorted(tracker.summary().get("queue_info", {}))
    if dev.key not in keys:
        raise _fail(dev, f"no RPC server registered this key (the tracker knows: {', '.join(keys) or 'none'}); "
                    f"start one on the board with `python -m tvm.exec.rpc_server --tracker "
                    f"{dev.host}:{dev.port} --key {dev.key}`")
    try:
        sess = tracker.request(dev.key, priority=1, session_timeout=dev.timeout_s, max_retry=3)
    except (RuntimeError, OSError) as e:
        raise _fail(dev, f"the tracker gave no session ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                    ) from None
    _SESSIONS[ident] = sess
    return sess


def load_remote(lib, target: Target):
    """(module, device) on the target's RPC device for a library built here."""
    from tvm.support import cc

    dev = target.rpc
    sess = session(dev)
    name = f"packager_{uuid.uuid4().hex[:12]}.so"
    fcompile = None if target.arch == host_arch() else cc.cross_compiler(Toolchain.for_arch(target.arch).cxx)
    with tempfile.TemporaryDirectory(prefix="packager-rpc-") as tmp:
        path = Path(tmp) / name
        lib.export_library(str(path), fcompile=fcompile)
        try:
            sess.upload(str(path))
            return sess.load_module(name), sess.cpu()
        except Exception as e:  # noqa: BLE001 - TVM raises its own error types across the RPC boundary
            raise _fail(dev, f"could not load the candidates there: {str(e).splitlines()[0]}") from None
