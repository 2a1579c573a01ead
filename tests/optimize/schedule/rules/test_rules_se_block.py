"""Squeeze-and-excite blocks (MobileNetV3, EfficientNet, RegNetY, PP-OCR): every kernel schedules
right, and the excite conv, whose epilogue scales the whole feature map, computes its reduction
once per tile (dlight's rule recomputed it per feature-map row, in scalar code: 3.1 ms against
0.1 ms for a 240 -> 960 conv over 14 x 14). A kernel whose producer stores at a computed index
(TVM's layout_transform out of channel blocks, folded before a channel slice by global fusion) is
not given to dlight's rule either, which computed that producer over a wrong region (4 of 8 lanes
copied: the SE blocks after padded convs read garbage in ppocrv5_rec and regnety_002); since
padded channels flow into the convs reading them, such kernels come from other graphs
(test_scatter_producers.py)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.optimize.relax_util import prim_funcs
from packager.optimize.schedule.rules.cpu import CpuRules
from support.kernel_cases import host_target, optimized_module, random_args, run_kernel


def _se_block(r: int):
    """conv -> global mean -> 1x1 conv to `r` channels -> ReLU -> 1x1 conv -> HardSigmoid ->
    scale. With r = 60 the squeeze conv computes 64 (padded to whole blocks), which the excite
    conv takes with zero weights (layout/pad.py), so no kernel unpacks and slices them."""
    c = 240
    rng = np.random.default_rng(0)

    def w(*s):
        return numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32))

    inits = {"w0": w(c, c, 1, 1), "w1": w(r, c, 1, 1), "b1": w(r), "w2": w(c, r, 1, 1), "b2": w(c)}
    for k, v in inits.items():
        v.name = k
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("GlobalAveragePool", ["x0"], ["g"]),
             helper.make_node("Conv", ["g", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"]), helper.make_node("HardSigmoid", ["c2"], ["s"]),
             helper.make_node("Mul", ["x0", "s"], ["y"])]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 80])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 6, 80])], list(inits.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("squeezed", [60, 64])
def test_every_kernel_of_an_se_block_schedules_right(squeezed):
    target = host_target()
    rules = CpuRules(target)
    excite = 0
    for name, func in prim_funcs(optimized_module(_se_block(squeezed), target)).items():
        scheduled, info = rules.schedule(func)
        script = func.script()
        assert "strided_slice" not in script, name
        if "conv2d" in script and "T_minimum" in script:          # the excite conv, HardSigmoid, scale
            excite += 1
            assert info.rule == "tiled-reduction", f"{name}: {info.summary()}"
        args = random_args(func)
        np.testing.assert_allclose(run_kernel(scheduled, target, [a.copy() for a in args]),
                                   run_kernel(func, target, [a.copy() for a in args]), rtol=1e-4, atol=1e-4,
                                   err_msg=f"{name}: {info.summary()}")
    if squeezed == 64:                 # whole blocks: the excite conv's kernel scales the map
        assert excite == 1
