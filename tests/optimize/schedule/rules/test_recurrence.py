"""Recurrent loop kernels are regenerated per device: the CPU form (vector lanes, a parallel
matrix-vector product) computes exactly what the plain loops compute, for every cell kind and
variant; the GPU form compiles to CUDA with its barriers; and no other rule or technique takes
such a kernel (the rules yield it only; global fusion leaves it alone)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import tirx

from packager.frontend.recurrent_kernel import Cell, kernel
from packager.optimize.schedule.rules import recurrence
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.optimize.schedule.tir_util import PARALLEL_MIN_WORK
from packager.spec import TargetSpec
from packager.targets import resolve

ACTS = {"GRU": (("Sigmoid", None, None), ("Tanh", None, None)),
        "LSTM": (("Sigmoid", None, None), ("Tanh", None, None), ("Tanh", None, None)),
        "RNN": (("Tanh", None, None),)}
CASES = [("GRU", {}), ("GRU", {"linear_before_reset": True}), ("LSTM", {}),
         ("LSTM", {"peepholes": True, "input_forget": True}), ("LSTM", {"clip": 0.4, "reverse": True}),
         ("RNN", {"reverse": True}), ("GRU", {"acts": (("HardSigmoid", 0.3, 0.4), ("LeakyRelu", 0.2, None))}),
         ("RNN", {"acts": (("Softsign", None, None),)}), ("RNN", {"acts": (("Elu", 0.7, None),)}),
         ("LSTM", {"acts": (("Sigmoid", None, None), ("Softplus", None, None), ("Softsign", None, None))}),
         ("RNN", {"acts": (("Relu", None, None),), "clip": 2.0})]


def _cell(op: str, steps: int, batch: int, hidden: int, **extra) -> Cell:
    return Cell(op, steps, batch, hidden, extra.pop("acts", ACTS[op]), **extra)


def _run(func: tirx.PrimFunc, cell: Cell, seed: int = 0) -> list[np.ndarray]:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(s).astype(np.float32) * 0.7 for _, s in cell.inputs()]
    args += [np.zeros(s, np.float32) for _, s in cell.outputs()]
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors[len(cell.inputs()):]]


@pytest.mark.parametrize("op,extra", CASES)
@pytest.mark.parametrize("steps,batch,hidden", [(9, 2, 16), (5, 3, 6), (3, 1, 128)])
def test_the_cpu_form_computes_what_the_plain_loops_compute(op, extra, steps, batch, hidden):
    cell = _cell(op, steps, batch, hidden, **extra)
    plain = kernel(cell)
    looped, info = recurrence.cpu(plain, 16)
    assert info.rule == "recurrence" and info.vector == {16: 16, 6: 2, 128: 16}[hidden]
    # a step's gate products (batch x gates x hidden^2) pay a parallel launch from PARALLEL_MIN_WORK
    assert (info.parallel > 1) == (batch * cell.gates * hidden * hidden >= PARALLEL_MIN_WORK)
    for want, got in zip(_run(plain, cell), _run(looped, cell)):
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_rules_offer_the_regenerated_kernel_then_the_plain_loops_only():
    cell = _cell("GRU", 4, 1, 32)
    plain = kernel(cell).with_attr("global_symbol", "gru_loop")
    offered = list(CpuRules(resolve(TargetSpec("x86-64", {}, "test"))).candidates(plain))
    assert [info.rule for _, info in offered] == ["recurrence", "naive"]
    assert offered[1][0].same_as(plain)
    assert offered[0][0].attrs["global_symbol"] == "gru_loop"            # the kernel keeps its attributes
    assert recurrence.cell_of(offered[0][0]) == cell


def test_a_kernel_that_is_not_a_recurrence_is_left_to_the_other_rules():
    from tvm import te
    a = te.placeholder((8,), name="a")
    add = te.create_prim_func([a, te.compute((8,), lambda i: a[i] + 1.0, name="add")])
    assert recurrence.cell_of(add) is None and recurrence.cpu(add, 16) is None and recurrence.gpu(add) is None


@pytest.mark.parametrize("op,extra", [("GRU", {}), ("GRU", {"linear_before_reset": True}),
                                      ("LSTM", {"peepholes": True}), ("RNN", {"reverse": True})])
def test_the_gpu_form_compiles_to_cuda_with_one_block_per_batch_row(op, extra):
    cell = _cell(op, 6, 3, 40, **extra)
    func = recurrence.gpu(kernel(cell))
    assert func.attrs["tirx.is_scheduled"]
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    lib = tvm.tirx.build(mod, target=tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    source = lib.imports[0].inspect_source()
    assert "__syncthreads()" in source and "__shared__" in source
    assert f"__launch_bounds__({min(1024, -(-cell.gates * cell.padded // 32) * 32)})" in source
