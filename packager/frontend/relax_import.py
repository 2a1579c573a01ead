"""The bound ONNX model -> a Relax IRModule through TVM's ONNX frontend (after our rewrites)."""
from __future__ import annotations

import warnings

from ..errors import InternalError, UserError
from .model import LoadedModel, first_line, infer_shapes
from .rewrites import rewrite


def import_relax(model: LoadedModel, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]):
    """Import the bound model into a Relax IRModule (weights embedded as constants)."""
    from tvm.relax.frontend.onnx import from_onnx

    bound, _ = rewrite(infer_shapes(model, shapes))
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
    return mod
