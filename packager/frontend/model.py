"""ONNX in: load the file, check it, and bind its shapes from the spec.

Everything a user can get wrong about the model (file, opset, operators, shapes, dtypes) is
caught here, before any compilation, and reported with the node or input it concerns.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import UnsupportedConfigError, UnsupportedOpsError, UserError
from ..spec import Profile, Spec, spec_error
from . import recurrent, selection
from .attrs import all_graphs, attr, initializer
from .opset import OPSET_MAX, OpsetConversion, default_opset, to_supported_opset

if TYPE_CHECKING:
    from .control_flow import ControlFlowResult


# Operators the packager compiles: they lower to static-shape TIR kernels with no runtime
# library calls. Ops the frontend knows but that need data-dependent shapes or TVM runtime
# functions (NonZero, Unique, NonMaxSuppression, sequences, ...) are not listed (TopK, CumSum and
# Resize are rewritten into plain operators first: selection.py, resize.py),
# nor IsInf (TVM's importer ignores detect_negative/detect_positive and gives wrong results),
# Cosh/Sinh (LLVM has no intrinsic for them in TVM 0.27) or Mish (TVM's
# float32 softplus loses the small values ONNX's tests check near x = -10).
SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
Cast CastLike Ceil Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos
DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand Flatten Floor Gather GatherElements
Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GroupNormalization HardSigmoid
HardSwish Identity InstanceNormalization IsNaN LayerNormalization LeakyRelu Less
LessOrEqual Log LogSoftmax MatMul Max MaxPool Mean Min Mod Mul Neg Not Or Pad Pow PRelu
Range Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
ReduceSum ReduceSumSquare Relu Reshape Round Selu Shape Shrink Sigmoid Sign Sin Size Slice
Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile
Transpose Trilu Unsqueeze Where Xor
LSTM GRU RNN Resize LRN ScatterND GatherND DequantizeLinear QuantizeLinear DynamicQuantizeLinear MatMulInteger
CumSum TopK QLinearMatMul QLinearConv ConvInteger
""".split())

TENSOR_TYPES = frozenset(v for v in onnx.TensorProto.DataType.values() if v != onnx.TensorProto.UNDEFINED)
ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
}

MAX_TENSOR_BYTES = 2**63 - 1      # what numpy, ONNX and the runtime (int64 sizes) can address
MAX_RANK = 8                      # PACKRT_MAX_DIMS: the runtime refuses a plan with a tensor of higher rank

# dim_param values exporters write for "unknown" (Paddle writes '?' for every dynamic dim): each one is
# its own dim, not one name shared by all of them
ANONYMOUS_DIM_PARAMS = {"", "?", "-1", "None"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int | str, ...]     # as declared in the model (symbolic dims are strings)


@dataclass
class LoadedModel:
    path: Path
    proto: onnx.ModelProto
    opset: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    label: str = ""                  # how messages name it (a part of a model: "model.onnx [part p0]")
    conversion: OpsetConversion | None = None    # set when the file's opset was outside the supported range
    control_flow: ControlFlowResult | None = None         # control_flow.ControlFlowResult once static If/Loop were taken out

    def __str__(self) -> str:
        return self.label or str(self.path)


def weight_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the main graph's initializers (what a package's kernels stream as weights)."""
    total = 0
    for t in proto.graph.initializer:
        n = 1
        for d in t.dims:
            n *= int(d)
        total += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def load_model(path: Path) -> LoadedModel:
    """Load and check an ONNX file (external data next to it is fine), in the supported opset range."""
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file" if path.exists() else "not found"
        raise UserError(f"{path}: model file {what}; give the path of an ONNX file")
    try:
        proto = onnx.load(str(path), load_external_data=True)
    except Exception as e:  # protobuf decode errors, missing external data files
        raise UserError(f"{path}: not a readable ONNX model ({first_line(e)}); "
                        "check that the file is complete and its external data files sit next to it") from None
    try:
        onnx.checker.check_model(str(path))   # path form: works for models over 2 GB too
    except Exception as e:
        raise UserError(f"{path}: ONNX checker rejected the model: {checker_message(e)}") from None
    _check_tensors(proto.graph, path)
    if not proto.graph.output:
        raise UserError(f"{path}: the graph has no outputs, so a package of it would compute nothing; "
                        "export the model with its outputs")
    proto, conversion = to_supported_opset(proto, path)
    inits = {i.name for i in proto.graph.initializer}
    inputs = [_tensor_info(v, path) for v in proto.graph.input if v.name not in inits]
    outputs = [_tensor_info(v, path) for v in proto.graph.output]
    opset = default_opset(proto) or OPSET_MAX     # a model of only ai.onnx.ml/custom nodes has none
    return LoadedModel(path, proto, opset, inputs, outputs, conversion=conversion)


def _check_tensors(graph: onnx.GraphProto, path: Path) -> None:
    """Every initializer and constant attribute (subgraphs included) decodes: a known element type
    and data that fits its dims. ONNX's checker misses some (raw_data of the wrong length, element
    type 99), which would otherwise fail deep inside the rewrites or TVM's importer."""
    for g in all_graphs(graph):
        tensors = [(f"initializer '{t.name}'", t) for t in g.initializer]
        for k, n in enumerate(g.node):
            for a in n.attribute:
                where = f"node {n.name or f'#{k}'} ({n.op_type}) attribute '{a.name}'"
                tensors += [(where, t) for t in ([a.t] if a.HasField("t") else []) + list(a.tensors)]
        for where, t in tensors:
            if t.data_type not in TENSOR_TYPES:
                raise UserError(f"{path}: {where} has element type {t.data_type}, which is not an ONNX type")
            try:
                numpy_helper.to_array(t)
            except Exception as e:  # noqa: BLE001 - numpy/onnx raise ValueError, TypeError, ...
                raise UserError(f"{path}: {where} does not decode ({first_line(e)}): its data does not fit its "
                                f"dims {list(t.dims)}; re-export the model") from None


def first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def checker_message(e: Exception) -> str:
    """The ONNX checker's message on one line, with the node it names: its context ("==> Context:
    Bad node spec for node. Name: relu_7 OpType: Relu") follows the first line after a blank one."""
    lines = [ln.strip() for ln in (str(e).strip() or type(e).__name__).splitlines() if ln.strip()]
    context = [ln.removeprefix("==> Context:").strip() for ln in lines[1:] if ln.startswith("==> Context:")]
    return (lines[0] + "".join(f" ({c})" for c in context))[:400]


def _tensor_info(v: onnx.ValueInfoProto, path: Path) -> TensorInfo:
    tt = v.type.tensor_type
    if not v.type.HasField("tensor_type"):
        raise UserError(f"{path}: graph input/output '{v.name}' is not a tensor; only tensor I/O is supported")
    dtype = ONNX_DTYPES.get(tt.elem_type)
    if dtype is None:
        known = tt.elem_type in onnx.TensorProto.DataType.values()
        name = onnx.TensorProto.DataType.Name(tt.elem_type) if known else tt.elem_type
        raise UserError(f"{path}: graph input/output '{v.name}' has element type {name}, which is not supported")
    if len(tt.shape.dim) > MAX_RANK:
        raise UserError(f"{path}: graph input/output '{v.name}' has rank {len(tt.shape.dim)}; packages hold tensors "
                        f"of rank {MAX_RANK} at most")
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:      # some exporters write -1 for "dynamic"
            dims.append(int(d.dim_value))
        else:
            anonymous = d.dim_param in ANONYMOUS_DIM_PARAMS
            dims.append(f"{v.name}_dim{i}" if anonymous else d.dim_param)
    return TensorInfo(v.name, dtype, tuple(dims))


def check_operators(model: LoadedModel) -> None:
    """Raise one error that lists every unsupported operator type with its node names."""
    bad: dict[str, list[str]] = {}
    for i, node in enumerate(model.proto.graph.node):
        domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        key = node.op_type if not domain else f"{domain}.{node.op_type}"
        if domain or node.op_type not in SUPPORTED_OPS:
            bad.setdefault(key, []).append(node.name or f"#{i}")
    if bad:
        raise UnsupportedOpsError(str(model), bad)


# Operands that must be compile-time constants (initializers, Constant nodes, or arithmetic on
# Shape/Size of tensors), never graph-input data: most decide output *shapes*, which are static
# per profile; Pad's constant_value is one TVM's importer needs as a constant too.
STATIC_OPERANDS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "CumSum": (1,), "TopK": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "Resize": (1, 2, 3), "LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3),
    "QLinearMatMul": (1, 2, 4, 5, 6, 7), "QLinearConv": (1, 2, 3, 4, 5, 6, 7, 8), "ConvInteger": (1, 2, 3),
}
SHAPE_ONLY_OPS = {"Shape", "Size"}           # their outputs depend on shapes, not values


def unsupported_configuration(node: onnx.NodeProto, graph: onnx.GraphProto | None = None) -> str | None:
    """Why a supported op used this way cannot be compiled (training-time behaviour, outputs or
    attributes TVM's importer does not implement), or None."""
    extra_outputs = [o for o in node.output[1:] if o]
    attrs = {a.name: a for a in node.attribute}
    op = node.op_type
    if op == "BatchNormalization" and (extra_outputs or ("training_mode" in attrs and attrs["training_mode"].i)):
        return "is in training mode; export the model for inference"
    if op == "Dropout" and len(node.input) > 2 and node.input[2]:
        return "has a training_mode input (training-time dropout)"
    if op == "MaxPool" and extra_outputs:
        return "uses the optional Indices output"
    if op == "ConvTranspose" and "output_shape" in attrs:
        return "sets output_shape, which TVM's importer ignores; give pads/output_padding instead"
    if op in recurrent.GATES:
        return recurrent.unsupported(node)
    if op == "Reshape" and "allowzero" in attrs and attrs["allowzero"].i and graph is not None:
        shape = initializer(graph, node.input[1])
        if shape is not None and (shape == 0).any():
            return "uses allowzero=1 with a 0 in its shape (an empty tensor)"
    if op == "TopK":
        k = initializer(graph, node.input[1]) if graph is not None and len(node.input) > 1 else None
        if k is not None and int(k.ravel()[0]) > selection.TOPK_MAX_K:
            return f"selects k = {int(k.ravel()[0])} (compiled: k <= {selection.TOPK_MAX_K})"
    if op in ("QuantizeLinear", "DequantizeLinear") and "block_size" in attrs and attrs["block_size"].i:
        return "uses blocked quantization (block_size), which TVM's importer does not implement"
    return None


def check_kernel_shapes(model: LoadedModel) -> None:
    """A Conv/ConvTranspose whose kernel_shape attribute disagrees with its weights is an invalid
    model (onnxruntime refuses to run it); compiled, it would compute what the weights imply."""
    graph = model.proto.graph
    weights = {t.name: t for t in graph.initializer}
    for k, node in enumerate(graph.node):
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
            continue
        kernel = attr(node, "kernel_shape")
        w = weights.get(node.input[1])
        if kernel is not None and w is not None and list(kernel) != list(w.dims[2:]):
            raise UserError(f"{model}: node {node.name or f'#{k}'} ({node.op_type}) has kernel_shape {kernel}, but its "
                            f"weights '{w.name}' are {list(w.dims)}; fix or drop the attribute")


def runtime_values(nodes, seeds: set[str], opaque: set[int] = frozenset()) -> set[str]:
    """Tensors whose values are known only at run time: the `seeds`, everything computed from
    them (Shape/Size see only shapes, which are static), and all outputs of the `opaque` nodes."""
    dynamic = set(seeds)
    for k, node in enumerate(nodes):
        if k in opaque or (node.op_type not in SHAPE_ONLY_OPS and any(i in dynamic for i in node.input)):
            dynamic.update(o for o in node.output if o)
    return dynamic


def check_configurations(model: LoadedModel) -> None:
    """Reject supported ops used in ways that cannot be compiled ahead of time, naming the node:
    static operands computed from input data, and the configurations above."""
    graph = model.proto.graph
    data_dependent = runtime_values(graph.node, {i.name for i in model.inputs})
    problems = []
    for k, node in enumerate(graph.node):
        name = node.name or f"#{k}"
        for idx in STATIC_OPERANDS.get(node.op_type, ()):
            if idx < len(node.input) and node.input[idx] in data_dependent:
                problems.append(f"node {name} ({node.op_type}) takes input #{idx} '{node.input[idx]}' from the "
                                "model's input data, so its output shape is only known at run time; "
                                "make that operand a constant")
        why = unsupported_configuration(node, graph)
        if why:
            problems.append(f"node {name} ({node.op_type}) {why}")
    if problems:
        raise UnsupportedConfigError(f"{model}: " + "; ".join(problems[:5]) +
                                     (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""))


def bind_profiles(spec: Spec, model: LoadedModel) -> dict[str, str]:
    """Check the spec's inputs against the model; return the dtype of every input.

    Every model input must appear in every profile with the model's rank, matching static
    dims, and one size per symbolic dim name (shared names must agree across inputs).
    """
    names = [i.name for i in model.inputs]
    dtypes: dict[str, str] = {}
    for extra in set(spec.inputs) - set(names):
        raise spec_error(spec, f"inputs.{extra}", f"the model has no input '{extra}' (its inputs: {', '.join(names)})")
    for info in model.inputs:
        declared = spec.inputs.get(info.name)
        if declared is None:
            if all(isinstance(d, int) for d in info.shape):
                dtypes[info.name] = info.dtype
                continue
            dyn = [str(d) for d in info.shape if not isinstance(d, int)]
            raise spec_error(spec, "inputs", f"input '{info.name}' has dynamic dims {dyn}: bind them with "
                             f"inputs: {{{info.name}: {{shape: [...]}}}}")
        if declared.dtype and declared.dtype != info.dtype:
            raise spec_error(spec, f"inputs.{info.name}.dtype",
                             f"the model declares {info.dtype} for '{info.name}', the spec says {declared.dtype}")
        dtypes[info.name] = info.dtype
    for k, prof in enumerate(spec.profiles):
        where = "inputs" if k == 0 else f"profiles[{k - 1}].inputs"
        sym: dict[str, tuple[int, str]] = {}
        for info in model.inputs:
            shape = prof.shapes.get(info.name, tuple(info.shape))
            p = f"{where}.{info.name}.shape"
            if len(shape) != len(info.shape):
                raise spec_error(spec, p, f"input '{info.name}' has rank {len(info.shape)} in the model "
                                 f"{list(info.shape)}, the spec gives {list(shape)}")
            for axis, (want, got) in enumerate(zip(info.shape, shape)):
                if isinstance(want, int) and want != got:
                    raise spec_error(spec, p, f"dim {axis} of '{info.name}' is fixed to {want} in the model, "
                                     f"the spec gives {got}")
                if isinstance(want, str):
                    if want in sym and sym[want][0] != got:
                        raise spec_error(spec, p, f"dynamic dim '{want}' is {got} here but {sym[want][0]} "
                                         f"for {sym[want][1]}; inputs sharing a dim name must agree")
                    sym.setdefault(want, (got, info.name))
            if math.prod(shape) * np.dtype(dtypes[info.name]).itemsize > MAX_TENSOR_BYTES:
                raise spec_error(spec, p, f"input '{info.name}' of shape {list(shape)} would take more than 2^63 "
                                 "bytes; give sizes the target can hold")
    for name, value in spec.verify.inputs.items():
        if name not in names:
            raise spec_error(spec, f"verify.inputs.{name}", f"the model has no input '{name}' "
                             f"(its inputs: {', '.join(names)})")
        for prof in spec.profiles:
            shape = prof.shapes.get(name, next(i.shape for i in model.inputs if i.name == name))
            try:
                np.broadcast_to(np.asarray(value), shape)
            except ValueError:
                raise spec_error(spec, f"verify.inputs.{name}", f"a value of shape {list(np.shape(value))} does not "
                                 f"broadcast to the input's shape {list(shape)} in profile {prof.name}") from None
    return dtypes


def profile_shapes(model: LoadedModel, prof: Profile) -> dict[str, tuple[int, ...]]:
    return {i.name: tuple(prof.shapes.get(i.name, i.shape)) for i in model.inputs}  # type: ignore[arg-type]


def random_inputs(model: LoadedModel, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str],
                  seed: int = 0, values: dict | None = None) -> dict[str, np.ndarray]:
    """Deterministic test inputs: normal floats, small non-negative integers, random bools; an
    input named in `values` (the spec's verify.inputs) gets that value, broadcast to its shape."""
    rng = np.random.default_rng(seed)
    out = {}
    for info in model.inputs:
        shape, dt = shapes[info.name], dtypes[info.name]
        if values and info.name in values:
            out[info.name] = np.broadcast_to(np.asarray(values[info.name], dt), shape).copy()
        elif dt.startswith("float"):
            out[info.name] = rng.standard_normal(shape).astype(dt)
        elif dt == "bool":
            out[info.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[info.name] = rng.integers(0, 4, shape).astype(dt)
    return out
