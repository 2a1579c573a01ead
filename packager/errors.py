"""Error types that the CLI turns into one clear line and an exit code.

UserError (exit 2) means the input is wrong and the message says what to change;
InternalError (exit 1) means the packager or a tool it drives failed.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path


class PackagerError(Exception):
    """Base class: carries the exit code the CLI should use."""

    exit_code = 1


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped (as `\\n`, `\\x1c`, ...):
    messages quote keys, node and tensor names from the user's files, which may hold any
    character, and a user error must stay one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class UserError(PackagerError):
    """Bad input: a spec, model, package or argument the user can fix. Its message is one line."""

    exit_code = 2

    def __init__(self, message: object = "", *args: object):
        super().__init__(one_line(str(message)), *args)


class InternalError(PackagerError):
    """A failure inside the packager or one of the compilers it runs."""

    exit_code = 1


class UnsupportedConfigError(UserError):
    """A supported operator used in a way that cannot be compiled ahead of time."""


class UnsupportedOpsError(UserError):
    """The model uses operators the packager cannot compile; lists every one of them."""

    def __init__(self, model: str, ops: dict[str, list[str]]):
        self.ops = ops
        parts = [f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                 for op, names in sorted(ops.items())]
        super().__init__(f"{model}: unsupported operator(s): {'; '.join(parts)}. Remove or replace them, or "
                         "drop `onnxruntime: {fallback: false}` from the spec to run them in ONNX Runtime (partial "
                         "offload).")


# errno values that mean "this folder cannot take what we write": the disk or quota is full, the
# file system is read-only, or we may not write there
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})
LOW_SPACE_BYTES = 1 << 20


def write_failure(exc: BaseException, folder: Path, what: str, hint: str) -> UserError | None:
    """The UserError for `exc` if it is the disk refusing a write into `folder` (the file system
    is full or read-only), else None: `what` names the output ("package to dist/x"), `hint` says
    what to do. A compiler or TVM writing there fails with its own error, so a full or read-only
    file system at the time of the failure counts too."""
    if not isinstance(exc, Exception) or isinstance(exc, UserError):     # Ctrl-C stays Ctrl-C
        return None
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        _src, dst, why = exc.args[0][0]        # copytree collects (src, dst, error text) per file
        found = re.match(r"\[Errno (\d+)\]", str(why))
        if found and int(found.group(1)) in WRITE_ERRNOS:
            exc = OSError(int(found.group(1)), os.strerror(int(found.group(1))), dst)
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        where = f" ({exc.filename})" if exc.filename else ""
        return UserError(f"cannot write {what}: {exc.strerror or exc}{where}; {hint}")
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fs = os.statvfs(probe)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        why = "Read-only file system"
    elif fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES:
        why = "No space left on device"
    else:
        return None
    text = str(exc).strip().splitlines()
    return UserError(f"cannot write {what}: {why} ({type(exc).__name__}: {text[0][:200] if text else ''}); {hint}")
