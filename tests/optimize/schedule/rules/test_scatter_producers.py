"""Rules that compute a producer at their row or column loop refuse a producer that stores at a
computed index: TVM derives its region wrongly (squeezenet's softmax, after a padded conv's
channels were taken back behind the global pool, read 8 of 1000 inputs unwritten)."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import s_tir

from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.tir_util import RuleMismatch
from support.kernel_cases import host_target, random_args, run_kernel


def _unpack_slice_softmax():
    """NCHW16c (63 blocks) -> NCHW by a block writing [n, c_o * 16 + c_i] (as TVM's
    layout_transform does) -> first 1000 channels -> softmax: the kernel global fusion folded
    in squeezenet."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def main(p0: T.Buffer((1, 63, 16), "float32"), out: T.Buffer((1, 1000), "float32")):
        unpacked = T.sblock_alloc_buffer((1, 1008))
        rows = T.sblock_alloc_buffer((1, 1000))
        top = T.sblock_alloc_buffer((1,))
        e = T.sblock_alloc_buffer((1, 1000))
        total = T.sblock_alloc_buffer((1,))
        for n, co, ci in T.grid(1, 63, 16):
            with T.sblock("unpack"):
                vn, vo, vi = T.axis.remap("SSS", [n, co, ci])
                unpacked[vn, vo * 16 + vi] = p0[vn, vo, vi]
        for n, c in T.grid(1, 1000):
            with T.sblock("slice"):
                vn, vc = T.axis.remap("SS", [n, c])
                rows[vn, vc] = unpacked[vn, vc]
        for n, k in T.grid(1, 1000):
            with T.sblock("max"):
                vn, vk = T.axis.remap("SR", [n, k])
                with T.init():
                    top[vn] = T.float32(-3.0e38)
                top[vn] = T.max(top[vn], rows[vn, vk])
        for n, c in T.grid(1, 1000):
            with T.sblock("exp"):
                vn, vc = T.axis.remap("SS", [n, c])
                e[vn, vc] = T.exp(rows[vn, vc] - top[vn])
        for n, k in T.grid(1, 1000):
            with T.sblock("sum"):
                vn, vk = T.axis.remap("SR", [n, k])
                with T.init():
                    total[vn] = T.float32(0)
                total[vn] = total[vn] + e[vn, vk]
        for n, c in T.grid(1, 1000):
            with T.sblock("norm"):
                vn, vc = T.axis.remap("SS", [n, c])
                out[vn, vc] = e[vn, vc] / total[vn]

    return main


def test_a_scattering_producer_is_refused_and_the_chosen_schedule_computes_the_same():
    target = host_target()
    func = _unpack_slice_softmax()
    rules = CpuRules(target)
    sch = s_tir.Schedule(func)
    assert any(rules._scatters(sch, b) for b in rules._blocks(sch))
    with pytest.raises(RuleMismatch, match="computed index"):
        rules.vector_row_reduction(s_tir.Schedule(func))
    scheduled, info = rules.schedule(func)
    args = random_args(func)
    np.testing.assert_allclose(run_kernel(scheduled, target, [a.copy() for a in args]),
                               run_kernel(func, target, [a.copy() for a in args]), rtol=1e-5, atol=1e-7)
