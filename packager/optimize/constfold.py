"""Constant folding that does not compile: element-wise arithmetic and reshapes of constants are
evaluated with numpy before TVM's FoldConstant, which compiles every op it folds with LLVM.

A BatchNorm folded into its conv leaves seven small ops per conv on constants (variance + eps,
sqrt, gamma / that, the weight times it, the bias terms, two reshapes). TVM's FoldConstant
legalizes and compiles each distinct one: SLANet's 619 took 29 s of its build, every rebuild
again. numpy computes the same IEEE float32 results (add, subtract, multiply, divide and sqrt
are correctly rounded in both; broadcasting is numpy's in Relax too), so the package does not
change; whatever op is not in the table below is left to FoldConstant, which runs after this.
Casts of constant float weights (a reduced-precision build's) are numpy's too. Two more never
compute a value: isnan (TVM's importer tests Clip's constant bounds with it) and
the layout pass's packed conv weights (layout_transform by a bijective index map, evaluated on
index arrays); MobileNetV2's 70 + 67 of them took 4.5 s of every build.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from .relax_util import is_const, rewrite_functions

_BINARY: dict[str, Callable] = {"relax.add": np.add, "relax.subtract": np.subtract,
                                "relax.multiply": np.multiply, "relax.divide": np.divide}
_UNARY: dict[str, Callable] = {"relax.sqrt": np.sqrt, "relax.negative": np.negative, "relax.isnan": np.isnan}
_FLOATS = ("float16", "float32", "float64")      # numpy rounds to nearest even, as TVM's casts do
_SHAPE = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.permute_dims"}


def _evaluate(call: relax.Call) -> np.ndarray | None:
    """The call's value when it is in the table and its tensor operands are constants."""
    name = getattr(call.op, "name", None)
    ty = call.ty
    if name is None or not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    if name in _BINARY or name in _UNARY:
        values = [_operand(a) for a in call.args]
        if any(v is None for v in values):
            return None
        if name == "relax.divide" and values[0].dtype.kind != "f":
            return None                       # integer division rounds differently in numpy
        with np.errstate(all="ignore"):       # inf / NaN are values like any other here
            out = (_BINARY.get(name) or _UNARY[name])(*values)
    elif name in _SHAPE and is_const(call.args[0]):
        out = _reshaped(name, call)
    elif name == "relax.layout_transform" and is_const(call.args[0]):
        out = _relaid(call)
    elif name == "relax.astype" and is_const(call.args[0]) and str(ty.dtype) in _FLOATS:
        value = call.args[0].value.numpy()    # a reduced-precision build's weights (precision.py)
        out = value.astype(str(ty.dtype)) if value.dtype.kind == "f" else None
    else:
        return None
    shape = tuple(int(d) for d in ty.shape.values) if hasattr(ty.shape, "values") else None
    if out is None or shape is None or out.shape != shape or str(out.dtype) != str(ty.dtype):
        return None
    return out


def _operand(e) -> np.ndarray | None:
    """A constant tensor's value, or a scalar PrimValue's (BatchNorm's epsilon) as a 0-d array."""
    if is_const(e):
        return e.value.numpy()
    if isinstance(e, (tvm.tirx.FloatImm, tvm.tirx.IntImm)):
        return np.array(e.value, dtype=str(e.ty))
    return None


def _reshaped(name: str, call: relax.Call) -> np.ndarray | None:
    x = call.args[0].value.numpy()
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return np.transpose(x, None if axes is None else [int(a) for a in axes])
    shape = call.ty.shape
    if not hasattr(shape, "values") or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return x.reshape([int(d) for d in shape.values])      # reshape, expand_dims, squeeze: the result's shape


def _relaid(call: relax.Call) -> np.ndarray | None:
    """A constant's layout_transform (a packed conv weight) by its index map, when the map is a
    bijection written with + - * // % (no padding): every element moves, none is computed."""
    x = call.args[0].value.numpy()
    im = call.attrs.index_map
    grid = np.indices(x.shape).reshape(x.ndim, -1)
    env = {v.name: g for v, g in zip(im.initial_indices, grid)}
    dst = [_index(e, env) for e in im.final_indices]
    shape = call.ty.shape
    if any(d is None for d in dst) or not hasattr(shape, "values") or \
            not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    out_shape = tuple(int(d) for d in shape.values)
    if math.prod(out_shape) != x.size:
        return None
    dst = [np.broadcast_to(d, (x.size,)) for d in dst]
    if any((d < 0).any() or (d >= n).any() for d, n in zip(dst, out_shape)):
        return None
    flat = np.ravel_multi_index(dst, out_shape)
    hit = np.zeros(x.size, bool)
    hit[flat] = True
    if not hit.all():                          # as many targets as elements: all hit = a bijection
        return None
    out = np.empty(x.size, x.dtype)
    out[flat] = x.reshape(-1)
    return out.reshape(out_shape)


_INDEX_OPS = {tvm.tirx.Add: np.add, tvm.tirx.Sub: np.subtract, tvm.tirx.Mul: np.multiply,
              tvm.tirx.FloorDiv: np.floor_divide, tvm.tirx.FloorMod: np.mod}


def _index(e, env: dict[str, np.ndarray]):
    """An index expression over the map's variables, on numpy arrays (None: an op not above)."""
    if isinstance(e, tvm.tirx.Var):
        return env.get(e.name)
    if isinstance(e, tvm.tirx.IntImm):
        return np.int64(e.value)
    op = next((f for cls, f in _INDEX_OPS.items() if isinstance(e, cls)), None)
    if op is None:
        return None
    a, b = _index(e.a, env), _index(e.b, env)
    if a is None or b is None or (op in (np.floor_divide, np.mod) and np.any(b == 0)):
        return None
    return op(a, b)


@relax.expr_functor.mutator
class _NumpyFold(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.folded = 0

    def visit_var_(self, var):
        return self._constant_or(super().visit_var_(var))

    def visit_dataflow_var_(self, var):
        return self._constant_or(super().visit_dataflow_var_(var))

    def _constant_or(self, var):
        """The constant `var` is bound to (one this pass folded), else `var`."""
        bound = self.lookup_binding(var)
        return bound if bound is not None and is_const(bound) else var

    def visit_call_(self, call):
        call = super().visit_call_(call)
        value = _evaluate(call)
        if value is None:
            return call
        self.folded += 1
        return relax.const(value, str(value.dtype))


def fold_constants(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """(`mod` with its constant computations folded, numpy's where it can, then TVM's; the ops
    numpy folded)."""
    m = _NumpyFold(mod)
    mod = rewrite_functions(m, mod)
    return tvm.transform.Sequential([relax.transform.FoldConstant(),
                                     relax.transform.DeadCodeElimination()])(mod), m.folded


@tvm.transform.module_pass(opt_level=0, name="FoldConstantsNumpyFirst")
def FoldConstants(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - a TVM pass, named like TVM's
    return fold_constants(mod)[0]
