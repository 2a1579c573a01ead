"""The dlight GPU rules as the schedule pass applies them: a rule whose kernel is unfit to ship
(tir_util.gpu_kernel_fault) is passed over for the next one."""
from __future__ import annotations

import onnx
import tvm
from onnx import helper

from support.kernel_cases import case, kernels_of, w

from packager.optimize.schedule.rules.gpu import dlight_rules, schedule_one
from packager.optimize.schedule.tir_util import gpu_kernel_fault
from packager.targets import CUDA_TABLE


def test_a_rule_whose_threads_write_past_a_shared_buffer_is_passed_over():
    """A squeeze-and-excite gate (ppocr_cls): an 8-row 1x1 conv on a pooled vector, hard-sigmoid,
    times the feature map. dlight's GEMV rule reduces it in a 32x16 block and lets all 16 rows
    of threads write the 8-element shared result; compute-sanitizer's memcheck caught it on an
    H200 while the outputs were right. The pass takes the next rule."""
    model = case("Conv", {"x": [1, 2, 1, 1]}, {}, {"w": w(8, 2, 1, 1), "b": w(8)},
                 [helper.make_node("HardSigmoid", ["y"], ["h"]), helper.make_node("Mul", ["h", "_map"], ["z"])])
    model.graph.initializer.append(onnx.numpy_helper.from_array(w(1, 8, 12, 96), "_map"))
    (name, func), = kernels_of(model).items()
    target = tvm.target.Target(CUDA_TABLE["h100"].tvm_target())
    func = func.with_attr("target", target)
    with target:
        gemv = dict(dlight_rules())["gemv"].apply(func, target, False)
        gemv = gemv[0] if isinstance(gemv, list) else gemv
        assert "can leave it" in gpu_kernel_fault(gemv.mod["main"], 48 * 1024)
        out, rule = schedule_one(name, func, target, dlight_rules())
    assert rule != "gemv" and gpu_kernel_fault(out, 48 * 1024) is None
