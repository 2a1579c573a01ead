"""The bound ONNX model -> a Relax IRModule through TVM's ONNX frontend, after static-shape
folding (fold.py, onnxruntime) and our rewrites (rewrites.py)."""
from __future__ import annotations

import re
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import onnx

from ..errors import InternalError, UserError
from .attrs import all_graphs
from .fold import fold_constants
from .model import LoadedModel, first_line
from .padfold import fold_pads_into_convs
from .lowering import LOWERED_TO
from .recurrent import OP_TYPE as RECURRENCE
from .recurrent_kernel import Cell, kernel
from .rewrites import rewrite
from .shapes import bind_dims, infer_shapes


@dataclass(frozen=True)
class ImportStats:
    """What the frontend did to one profile's model before TVM saw it (for the build report)."""

    folded: int                    # nodes onnxruntime's constant folding replaced by constants
    rewritten: int                 # nodes our rewrites replaced or folded
    note: str = ""                 # why onnxruntime did not fold, if it did not
    lowered: dict = field(default_factory=dict)    # op type -> how many were lowered (lowering.LOWERED_TO)
    pads_folded: int = 0           # zero Pads folded into the Conv reading them (padfold.py)
    conv1d_as_2d: int = 0          # 1-D Convs made 2-D over height 1 (rewrites.py)

    def as_dict(self) -> dict:
        return {"folded_by_onnxruntime": self.folded, "rewritten": self.rewritten, "pads_folded": self.pads_folded,
                "conv1d_as_2d": self.conv1d_as_2d,
                **({"note": self.note} if self.note else {}), **({"lowered": self.lowered} if self.lowered else {})}


def import_relax(model: LoadedModel, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str],
                 simplify: bool = False):
    """Import the bound model into a Relax IRModule (weights embedded as constants); returns it
    and what the frontend changed on the way. `simplify` (the simplify pass's ONNX steps): zero
    Pads become their Convs' padding (padfold.py), 1-D Convs 2-D ones over height 1."""
    from tvm.relax.frontend.onnx import from_onnx

    folded = fold_constants(bind_dims(model.proto, shapes))
    before = Counter(n.op_type for n in folded.model.graph.node if n.op_type in LOWERED_TO)
    counts: Counter = Counter()
    bound, rewritten = rewrite(infer_shapes(model, shapes, proto=folded.model), conv1d_as_2d=simplify, counts=counts)
    pads_folded = fold_pads_into_convs(bound, model.opset) if simplify else 0
    names = _identifiers(bound)
    shapes = {names.get(k, k): v for k, v in shapes.items()}
    dtypes = {names.get(k, k): v for k, v in dtypes.items()}
    try:
        with warnings.catch_warnings(), _importer_patched():
            warnings.simplefilter("ignore")
            mod = from_onnx(bound, shape_dict={k: list(v) for k, v in shapes.items()},
                            dtype_dict=dict(dtypes), opset=model.opset, keep_params_in_input=False)
    except Exception as e:
        raise UserError(f"{model}: TVM's ONNX importer failed: {first_line(e)}") from None
    params = list(mod["main"].params)
    if len(params) != len(model.inputs):
        raise InternalError(f"{model}: importer produced {len(params)} inputs, the model has {len(model.inputs)}")
    after = Counter(n.op_type for n in bound.graph.node if n.op_type in LOWERED_TO)
    return mod, ImportStats(folded.removed, rewritten, folded.note, dict(before - after), pads_folded,
                            counts["Conv"])


@contextmanager
def _importer_patched():
    """TVM's ONNX importer, also knowing the operators our rewrites emit (DOMAIN ai.packager:
    the recurrent loops, which become one kernel each). TVM 0.27 reads its operator table
    through `_get_convert_map` on every use; there is no public hook. Its call of ONNX's checker,
    whose findings it only warns about, is skipped: load_model checked the file, and the checker
    serializes the whole model (1.8 s of GPT-2's warm rebuild)."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    class Recurrence(fe.OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            text = attr["cell"]
            cell = Cell.from_json(text.decode() if isinstance(text, bytes) else text)
            func = kernel(cell)
            gv = bb.add_func(func, f"{cell.op.lower()}_loop")
            outs = [relax.TensorType(shape, cell.dtype) for _, shape in cell.outputs()]
            return bb.emit(relax.call_tir(gv, [x for x in inputs if x is not None], outs))

    table, check = fe._get_convert_map, onnx.checker.check_model
    fe._get_convert_map = lambda: {**table(), RECURRENCE: Recurrence}
    onnx.checker.check_model = lambda *args, **kwargs: None
    try:
        yield
    finally:
        fe._get_convert_map, onnx.checker.check_model = table, check


def _identifiers(model: onnx.ModelProto) -> dict[str, str]:
    """Rename graph inputs whose names are not C identifiers ('gpu_0/data_0'): TVM names kernel
    parameters after them, and the CUDA and OpenCL sources would not compile. Inputs are matched
    by position afterwards, so the new names never leave the import. Returns {old: new}."""
    taken = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}          # an input that is also an output keeps its name
    renames: dict[str, str] = {}
    for i in model.graph.input:
        if i.name.isidentifier() or i.name in outputs:
            continue
        base = re.sub(r"\W", "_", i.name)
        new = base if base[:1].isalpha() or base[:1] == "_" else f"_{base}"
        while new in taken:
            new += "_"
        taken.add(new)
        renames[i.name] = new
    if not renames:
        return renames
    for i in model.graph.input:
        i.name = renames.get(i.name, i.name)
    for g in all_graphs(model.graph):
        for n in g.node:
            n.input[:] = [renames.get(x, x) for x in n.input]
        if g is not model.graph:
            for o in g.output:
                o.name = renames.get(o.name, o.name)
    return renames
