"""Error types that the CLI turns into one clear line and an exit code.

UserError (exit 2) means the input is wrong and the message says what to change;
InternalError (exit 1) means the packager or a tool it drives failed.
"""
from __future__ import annotations


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
