"""Channel splits that layout propagation can carry: a split into equal parts given by its
indices becomes the same split given by its number of sections.

ONNX's Split names the part sizes, and TVM's importer passes them on as split indices. TVM 0.27's
layout rule for `relax.split` maps indices into a channel-blocked layout wrongly (a split of
NCHW16c at channel 32 gives a 0-channel part, and ConvertLayout fails), so the layout pass had
to lower every split to a kernel with NCHW around it (isolate.py). The rule for sections is
right: a split into parts of whole blocks stays packed, and one that is not falls back to NCHW.
CSP blocks (YOLOv5/v8/v11's C2f and C3k2) halve their channels
with a split like this; in YOLO11n 20 of 88 convs read NCHW because of it.
"""
from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..relax_util import rewrite_functions


def equal_parts(call: relax.Call) -> int | None:
    """The number of equal parts a split given by constant indices makes, else None."""
    spec = call.attrs.indices_or_sections
    shape = getattr(call.args[0].ty, "shape", None)
    if isinstance(spec, tirx.IntImm) or shape is None or not spec:
        return None
    axis = int(call.attrs.axis) % len(shape)
    if not all(isinstance(i, tirx.IntImm) for i in spec) or not isinstance(shape[axis], tirx.IntImm):
        return None
    bounds = [0, *(int(i) for i in spec), int(shape[axis])]
    sizes = {b - a for a, b in zip(bounds, bounds[1:])}
    return len(bounds) - 1 if len(sizes) == 1 and sizes.pop() > 0 else None


def packed_split(call: relax.Call, block: int) -> bool:
    """A channel split in sections whose parts are whole blocks of `block` (ConvertLayout keeps
    its parts in that block)."""
    shape, parts = getattr(call.args[0].ty, "shape", None), call.attrs.indices_or_sections
    return block > 1 and shape is not None and len(shape) == 4 and int(call.attrs.axis) % 4 == 1 \
        and isinstance(parts, tirx.IntImm) and int(shape[1]) % (int(parts) * block) == 0


@relax.expr_functor.mutator
class _Sections(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.split" or (parts := equal_parts(call)) is None:
            return call
        self.rewritten += 1
        return relax.op.split(call.args[0], parts, int(call.attrs.axis))


def splits_as_sections(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """(`mod` with every split into equal parts given by its number of sections, how many)."""
    m = _Sections(mod)
    out = rewrite_functions(m, mod)
    return (out, m.rewritten) if m.rewritten else (mod, 0)
