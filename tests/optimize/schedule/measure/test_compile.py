"""Candidates compiled one module per core: every function found under its name, and the same
results as one module."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from packager.optimize.schedule.measure import compile as comp


def _scale(k: float):
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: a[i] * k, name="b")
    return te.create_prim_func([a, b])


def test_functions_are_found_in_whichever_module_compiled_them(monkeypatch):
    monkeypatch.setattr(comp, "cores", lambda: 2)
    funcs = {f"c{i}": _scale(float(i)) for i in range(5)}
    lib = comp.build_library(funcs, tvm.target.Target("llvm"))
    assert len(lib.modules) == 2
    x = tvm.runtime.tensor(np.arange(64, dtype="float32"))
    for i in range(5):
        y = tvm.runtime.tensor(np.zeros(64, dtype="float32"))
        lib[f"c{i}"](x, y)
        np.testing.assert_allclose(y.numpy(), np.arange(64) * i)
    assert lib.time_evaluator("c3", tvm.cpu(), number=1, repeat=1)(x, y).mean > 0


def test_one_module_without_parallel_or_with_few_candidates(monkeypatch):
    monkeypatch.setattr(comp, "cores", lambda: 4)
    assert len(comp.build_library({"a": _scale(1.0), "b": _scale(2.0)}, tvm.target.Target("llvm")).modules) == 1
    funcs = {f"c{i}": _scale(1.0) for i in range(8)}
    assert len(comp.build_library(funcs, tvm.target.Target("llvm"), parallel=False).modules) == 1
    assert len(comp.build_library(funcs, tvm.target.Target("llvm")).modules) == 4


def test_a_part_that_does_not_compile_raises(monkeypatch):
    monkeypatch.setattr(comp, "cores", lambda: 2)
    real = tvm.tirx.build

    def build(mod, target):
        if "d" in [g.name_hint for g in mod.get_global_vars()]:
            raise RuntimeError("LLVM refused d")
        return real(mod, target=target)

    monkeypatch.setattr(comp.tvm.tirx, "build", build)
    with pytest.raises(RuntimeError, match="refused d"):
        comp.build_library({n: _scale(1.0) for n in "abcd"}, tvm.target.Target("llvm"))
