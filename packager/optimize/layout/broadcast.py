"""Per-channel constants that layout propagation can carry: BatchNorm as element-wise ops, and
broadcast constants at their tensor's full rank.

TVM's ConvertLayout keeps a channel-blocked layout through a binary op only when both operands
have the tensor's rank, and it has no layout rule for a BatchNorm that stays (one not after a
conv, e.g. DenseNet's BN on each concat): every such op ran in NCHW with a conversion on each
side. Caffe2 and Keras exports write per-channel scales as [C, 1, 1] constants (DenseNet-121
from the ONNX model zoo: 242 Mul/Add), so a model of packed convs paid two conversions per layer.
Here BatchNorm becomes TVM's own inference decomposition (the legalization would apply the same
one later, with the same constants folded) and each constant operand of a broadcasting
element-wise op is reshaped to [1, ..., 1, *shape], or to a scalar when it holds one value
(numpy's broadcasting: the same values, reshaped at build time).
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..constfold import FoldConstants
from ..relax_util import count_ops, is_const, rewrite_functions

# Broadcasting binary ops that propagate.FOLLOW carries in a packed layout.
BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
          "relax.power"}


@relax.expr_functor.mutator
class _FullRank(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.promoted = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) not in BINARY or len(call.args) != 2:
            return call
        rank = max(_rank(a) for a in call.args)
        if rank < 4:
            return call
        args = [self._promoted(a, rank) for a in call.args]
        if all(new.same_as(old) for new, old in zip(args, call.args)):
            return call
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def _promoted(self, e, rank: int):
        if not is_const(e) or _rank(e) in (0, rank):
            return e
        value = e.value.numpy()
        self.promoted += 1
        if value.size == 1:                   # one value: a scalar, which every layout broadcasts
            return relax.const(value.reshape(()), str(value.dtype))
        return relax.const(value.reshape((1,) * (rank - value.ndim) + value.shape), str(value.dtype))


def _rank(e) -> int:
    return int(getattr(e.ty, "ndim", -1) or 0)


def propagatable(mod: tvm.IRModule) -> tuple[tvm.IRModule, int, int]:
    """(module, BatchNorms decomposed, constants given full rank)."""
    before = count_ops(mod).get("relax.nn.batch_norm", 0)
    # The decomposition leaves (y, mean, var)[0] behind: canonicalized to y, so the layout search's
    # tracker (propagate._Tracker) sees the element-wise chain that ConvertLayout will follow.
    mod = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(), FoldConstants,
                                    relax.transform.CanonicalizeBindings(),
                                    relax.transform.DeadCodeElimination()])(mod)
    decomposed = before - count_ops(mod).get("relax.nn.batch_norm", 0)
    m = _FullRank(mod)
    mod = relax.transform.DeadCodeElimination()(rewrite_functions(m, mod))
    return mod, decomposed, m.promoted
