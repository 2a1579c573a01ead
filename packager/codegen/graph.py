"""The kernel graph: Relax `main` (after the graph passes) read as tensors + ordered kernel calls.

After legalization, `main` must be a flat list of `call_tir` bindings over inputs, constants and
earlier results; `extract_graph` turns it into the form the plan emitter consumes. Anything else
left in `main` is an op we cannot compile ahead of time. `merge_kernels` gives all shape
profiles one kernel table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import expr as ir

from ..errors import InternalError, UserError
from ..optimize.relax_util import is_const, prim_funcs


@dataclass
class Tensor:
    """A value in the kernel graph. `value` is set for weights (constants)."""

    id: int
    dtype: str
    shape: tuple[int, ...]
    kind: str                      # "input" | "intermediate" | "weight"
    name: str = ""
    value: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class Call:
    """One kernel invocation: PrimFunc `kernel` with arguments (inputs..., outputs...)."""

    kernel: str
    args: list[int]
    n_outputs: int = 1


@dataclass
class Graph:
    tensors: list[Tensor] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    kernels: dict[str, tvm.tirx.PrimFunc] = field(default_factory=dict)
    assemblies: list = field(default_factory=list)   # concats written in place (emit/in_place.py)

    def called(self) -> list[Call]:
        """The calls that run a kernel (an assembled concat's does not)."""
        skip = {a.call for a in self.assemblies}
        return [c for i, c in enumerate(self.calls) if i not in skip]

    def add(self, dtype: str, shape, kind: str, name: str = "", value=None) -> int:
        t = Tensor(len(self.tensors), str(dtype), tuple(int(d) for d in shape), kind, name, value)
        self.tensors.append(t)
        return t.id


def _tensor_type(ty, what: str):
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise UserError(f"{what} has type {ty}, not a tensor of static shape; bind every dynamic dim in the spec")
    try:
        return str(ty.dtype), tuple(int(d) for d in ty.shape)
    except (TypeError, ValueError):
        raise UserError(f"{what} has symbolic shape {ty.shape}; bind every dynamic dim in the spec") from None


def extract_graph(mod: tvm.IRModule, input_names: list[str], output_names: list[str]) -> Graph:
    """Read `main` (after legalize/fusion) as tensors + ordered kernel calls."""
    main = mod["main"]
    g = Graph(kernels=prim_funcs(mod))
    env: dict = {}                 # relax Var -> tensor id or list of tensor ids (tuples)
    consts: dict = {}              # constant node -> tensor id (same node used twice = one weight)

    for p, name in zip(main.params, input_names):
        dtype, shape = _tensor_type(p.ty, f"input '{name}'")
        env[p] = g.add(dtype, shape, "input", name)
        g.inputs.append(env[p])

    def value_of(e):
        if isinstance(e, ir.Var):
            if e not in env:
                raise InternalError(f"variable {e} used before definition in main")
            return env[e]
        if is_const(e):
            key = e
            if key not in consts:
                arr = e.value.numpy()
                consts[key] = g.add(arr.dtype, arr.shape, "weight", value=arr)
            return consts[key]
        if isinstance(e, ir.Tuple):
            return [value_of(f) for f in e.fields]
        if isinstance(e, ir.TupleGetItem):
            tup = value_of(e.tuple_value)
            return tup[int(e.index)]
        if isinstance(e, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm) for v in e.values):
            # an ONNX Shape result that static shapes made a compile-time constant
            if e not in consts:
                consts[e] = g.add("int64", (len(e.values),), "weight",
                                  value=np.array([int(v) for v in e.values], np.int64))
            return consts[e]
        raise UserError(f"operation {_describe(e)} could not be compiled to a kernel (it needs a runtime "
                        "library call or a data-dependent shape); run this part of the model in ONNX Runtime")

    body = main.body
    for block in body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                raise UserError(f"binding {b.var} in the lowered model is a {type(b).__name__}: "
                                "data-dependent shapes are not supported")
            v = b.value
            if isinstance(v, ir.Call) and getattr(v.op, "name", None) == "relax.call_tir":
                kernel = v.args[0].name_hint
                args = [value_of(a) for a in v.args[1].fields]
                if any(isinstance(a, list) for a in args):
                    raise InternalError(f"kernel {kernel} takes a tuple argument")
                out_ty = b.var.ty
                outs_ty = list(out_ty.fields) if isinstance(out_ty, relax.TupleType) else [out_ty]
                outs = [g.add(*_tensor_type(t, f"result of {kernel}"), "intermediate") for t in outs_ty]
                g.calls.append(Call(kernel, args + outs, len(outs)))
                env[b.var] = outs if isinstance(out_ty, relax.TupleType) else outs[0]
            else:
                env[b.var] = value_of(v)

    result = value_of(body.body)
    results = result if isinstance(result, list) else [result]
    if len(results) != len(output_names):
        raise UserError(f"TVM's importer produced {len(results)} output(s) for the model's {len(output_names)} "
                        f"({', '.join(output_names)}): some output comes from an optional operator output it does "
                        "not implement; remove that output from the graph")
    g.outputs = list(results)
    for tid, name in zip(results, output_names):
        if not g.tensors[tid].name:
            g.tensors[tid].name = name
    return g


def _describe(e) -> str:
    if isinstance(e, ir.Call):
        op = getattr(e.op, "name", None) or getattr(e.op, "name_hint", None) or str(e.op)
        return f"'{op}'"
    return f"'{type(e).__name__}'"


def _c_ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def merge_kernels(graphs: dict[str, Graph]) -> dict[str, tvm.tirx.PrimFunc]:
    """One kernel table for all profiles: identical kernels are shared, name clashes renamed;
    kernels only an assembled concat called are left out."""
    table: dict[str, tvm.tirx.PrimFunc] = {}
    by_hash: dict[int, list[str]] = {}
    for pname, g in graphs.items():
        used = {c.kernel for c in g.called()}
        rename = {}
        for kname in sorted(used):
            f = g.kernels[kname]
            h = tvm_ffi.structural_hash(f)
            same = next((n for n in by_hash.get(h, []) if tvm_ffi.structural_equal(table[n], f)), None)
            if same is None:
                new = kname if kname not in table else f"{kname}_{_c_ident(pname)}"
                while new in table:
                    new += "_"
                table[new] = f
                by_hash.setdefault(h, []).append(new)
                same = new
            rename[kname] = same
        for c in g.calls:
            c.kernel = rename.get(c.kernel, c.kernel)
        g.kernels = {rename[k]: g.kernels[k] for k in used}
    return table
