"""The bound ONNX model -> a Relax IRModule through TVM's ONNX frontend, after static-shape
folding (fold.py, onnxruntime) and our rewrites (rewrites.py)."""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

from ..errors import InternalError, UserError
from .fold import fold_constants
from .model import LoadedModel, bind_dims, first_line, infer_shapes
from .lowering import LOWERED_TO
from .rewrites import rewrite


@dataclass(frozen=True)
class ImportStats:
    """What the frontend did to one profile's model before TVM saw it (for the build report)."""

    folded: int                    # nodes onnxruntime's constant folding replaced by constants
    rewritten: int                 # nodes our rewrites replaced or folded
    note: str = ""                 # why onnxruntime did not fold, if it did not
    lowered: dict = field(default_factory=dict)    # op type -> how many were lowered (lowering.LOWERED_TO)

    def as_dict(self) -> dict:
        return {"folded_by_onnxruntime": self.folded, "rewritten": self.rewritten,
                **({"note": self.note} if self.note else {}), **({"lowered": self.lowered} if self.lowered else {})}


def import_relax(model: LoadedModel, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]):
    """Import the bound model into a Relax IRModule (weights embedded as constants); returns it
    and what the frontend changed on the way."""
    from tvm.relax.frontend.onnx import from_onnx

    folded = fold_constants(bind_dims(model.proto, shapes))
    before = Counter(n.op_type for n in folded.model.graph.node if n.op_type in LOWERED_TO)
    bound, rewritten = rewrite(infer_shapes(model, shapes, proto=folded.model))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_onnx(bound, shape_dict={k: list(v) for k, v in shapes.items()},
                            dtype_dict=dict(dtypes), opset=model.opset, keep_params_in_input=False)
    except Exception as e:
        raise UserError(f"{model}: TVM's ONNX importer failed: {first_line(e)}") from None
    params = list(mod["main"].params)
    if len(params) != len(model.inputs):
        raise InternalError(f"{model}: importer produced {len(params)} inputs, the model has {len(model.inputs)}")
    after = Counter(n.op_type for n in bound.graph.node if n.op_type in LOWERED_TO)
    return mod, ImportStats(folded.removed, rewritten, folded.note, dict(before - after))
