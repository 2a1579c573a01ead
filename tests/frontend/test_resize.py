"""Resize lowered per axis (frontend/resize.py) computes what onnxruntime computes, in every mode."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.errors import UserError
from packager.frontend.rewrites import rewrite

CASES = {
    "linear_half_pixel_2x": (dict(mode="linear"), [1, 1, 2, 2], None, None),
    "nearest_floor_asymmetric_fractional": (dict(mode="nearest", nearest_mode="floor",
                                                 coordinate_transformation_mode="asymmetric"),
                                            [1, 1, 1.7, 0.6], None, None),
    "cubic_antialias_down": (dict(mode="cubic", antialias=1, cubic_coeff_a=-0.5), [1, 1, 0.35, 0.6], None, None),
    "linear_align_corners_sizes": (dict(mode="linear", coordinate_transformation_mode="align_corners"),
                                   None, [2, 3, 11, 5], None),
    "crop_and_resize_extrapolate": (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                                         extrapolation_value=7.0), None, [2, 3, 6, 6],
                                    [0, 0, -0.2, 0.4, 1, 1, 0.6, 1.3]),
    "cubic_exclude_outside_axes": (dict(mode="cubic", exclude_outside=1, axes=[3]), [1.5], None, None),
    # one scale from the limiting axis, output lengths rounded half up (7 x 9/7 = 9, 5 x 9/7 = 6.43 -> 6)
    "linear_not_larger": (dict(mode="linear", keep_aspect_ratio_policy="not_larger", axes=[2, 3]), None, [9, 11],
                          None),
    "cubic_not_smaller_align_corners": (dict(mode="cubic", keep_aspect_ratio_policy="not_smaller",
                                             coordinate_transformation_mode="align_corners", axes=[2, 3]), None,
                                        [4, 3], None),        # max(4/7, 3/5): 7 -> 4.2 -> 4, 5 -> 3
    "nearest_not_larger_down": (dict(mode="nearest", keep_aspect_ratio_policy="not_larger", axes=[3, 2]), None,
                                [3, 5], None),
}


def _model(attrs, scales, sizes, roi) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(roi or [], np.float32), "roi"),
             numpy_helper.from_array(np.array(scales or [], np.float32), "scales")]
    inputs = ["x", "roi", "scales"]
    if sizes:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        inputs.append("sizes")
    g = helper.make_graph([helper.make_node("Resize", inputs, ["y"], name="resize", **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 8
    return m


def _run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("case", CASES)
def test_lowered_resize_matches_onnxruntime(case):
    m = _model(*CASES[case])
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 5)).astype(np.float32)
    lowered, changed = rewrite(onnx.shape_inference.infer_shapes(m))
    assert changed >= 1 and "Resize" not in {n.op_type for n in lowered.graph.node}
    np.testing.assert_allclose(_run(lowered, x), _run(m, x), rtol=1e-5, atol=1e-5)


def test_nearest_is_only_gathers():
    lowered, _ = rewrite(onnx.shape_inference.infer_shapes(_model(*CASES["nearest_floor_asymmetric_fractional"])))
    assert {n.op_type for n in lowered.graph.node} == {"Gather", "Identity"}


def test_scales_computed_at_run_time_are_a_clear_error():
    m = _model(dict(mode="linear"), [1, 1, 2, 2], None, None)
    m.graph.node.insert(0, helper.make_node("Identity", ["s0"], ["s1"]))
    m.graph.node[1].input[2] = "s1"
    m.graph.input.append(helper.make_tensor_value_info("s0", TensorProto.FLOAT, [4]))
    with pytest.raises(UserError, match=r"resize \(Resize\): its scales 's1' is computed at run time"):
        rewrite(onnx.shape_inference.infer_shapes(m))


def test_an_upsample_resizes_the_last_axis_first_and_a_downsample_last():
    """Gathers along the last axis are scalar loads, so they run where the tensor is smallest."""
    from packager.frontend.resize import axis_order

    assert axis_order([2, 3], (1, 21, 28, 28), [1, 21, 224, 224]) == [3, 2]
    assert axis_order([2, 3], (1, 21, 224, 224), [1, 21, 28, 28]) == [2, 3]
    assert axis_order([3], (1, 2, 3, 4), [1, 2, 3, 8]) == [3]


def test_an_upsample_lowered_last_axis_first_matches_onnxruntime():
    m = _model(dict(mode="linear"), [1, 1, 3, 4], None, None)
    lowered, _ = rewrite(onnx.shape_inference.infer_shapes(m))
    gathers = [n for n in lowered.graph.node if n.op_type == "Gather"]
    assert [helper.get_attribute_value(n.attribute[0]) for n in gathers] == [3, 3, 2, 2]
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(lowered, x), _run(m, x), rtol=1e-5, atol=1e-5)
