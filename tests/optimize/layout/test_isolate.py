"""A layout failure stays local (layout/isolate.py): an op whose layout inference TVM cannot do is
lowered to a kernel with NCHW around it, and the convs elsewhere keep their packed layouts."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

from packager.optimize.ieee import LEGALIZATIONS
from packager.optimize.layout.conv import legalize_conv2d
from packager.optimize.layout.isolate import isolate, lower_ops, op_types
from packager.optimize.layout.propagate import alter_layouts
from packager.optimize.relax_util import legalize
from packager.optimize.schedule.registry import scheduler_for
from test_propagate import X86, FixedSearch, _conv, _model, _w
from test_propagate import _run as run_onnx

RNG = np.random.default_rng(3)


def _conv_and_stack() -> tvm.IRModule:
    """A conv + ReLU beside a stack of two 3-D tensors (TVM 0.27's stack cannot infer layouts)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 16, 8, 8), "float32"))
    y = relax.Var("y", R.Tensor((1, 4, 5), "float32"))
    w = relax.const((RNG.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
            r = bb.emit(relax.op.nn.relu(c))
            s = bb.emit(relax.op.stack([y, y], axis=0))
            out = bb.emit_output(relax.Tuple([r, s]))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, feeds: list[np.ndarray]) -> list[np.ndarray]:
    built = relax.build(legalize(mod, {"relax.nn.conv2d": legalize_conv2d, **LEGALIZATIONS}), target="llvm")
    out = relax.VirtualMachine(built, tvm.cpu())["main"](*[tvm.runtime.tensor(f) for f in feeds])
    return [o.numpy() for o in out]


def test_the_op_that_cannot_convert_is_lowered_and_the_conv_stays_packed():
    mod = _conv_and_stack()
    n = X86.vector_lanes_f32
    laid, report = alter_layouts(mod, scheduler_for(X86), search=FixedSearch([(n, n)]))
    assert report.details["packed"] == 1 and "NCHW kept" not in report.summary
    assert "relax.stack lowered to kernels before layout conversion" in report.summary, report.summary
    feeds = [RNG.standard_normal((1, 16, 8, 8)).astype("float32"), RNG.standard_normal((1, 4, 5)).astype("float32")]
    for got, want in zip(_run(laid, feeds), _run(mod, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_only_the_failing_op_types_are_lowered():
    mod = _conv_and_stack()
    assert op_types(mod) == ["relax.nn.relu", "relax.stack"]          # conv2d itself is never lowered
    tried = []

    def converts(m):
        called = {getattr(c.op, "name", None) for c in _calls(m)}
        tried.append(called)
        return "relax.stack" not in called                              # a conversion that only stack breaks

    lowered, types = isolate(mod, converts, LEGALIZATIONS)
    assert types == ["relax.stack"] and "relax.nn.relu" in {getattr(c.op, "name", None) for c in _calls(lowered)}
    assert isolate(mod, lambda m: False, LEGALIZATIONS) == (None, [])   # lowering cannot help: unchanged
    assert lower_ops(mod, [], LEGALIZATIONS) is mod


def _calls(mod: tvm.IRModule) -> list:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def test_a_variadic_max_after_a_conv_keeps_the_conv_packed():
    """ONNX Max over three tensors (DNSMOS's front end) reaches the layout pass as binary maximums,
    not TVM's stack + max, whose layout inference failed for the whole model."""
    from onnx import helper

    n = X86.vector_lanes_f32
    m = _model([_conv("x", "w1", None, "c", pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
                helper.make_node("Neg", ["c"], ["g"]), helper.make_node("Max", ["c", "r", "g"], ["y"])],
               [1, n, 6, 6], {"w1": _w(n, n, 3, 3)})
    report, got, ref = run_onnx(m, [(n, n)])
    assert report.details["packed"] == 1 and "NCHW kept" not in report.summary, report.summary
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _split_model(sizes: list[int]):
    """YOLO's C2f block: a 1x1 conv's output split along channels into `sizes` (times the vector
    width), each part read by a 3x3 conv, the results summed."""
    from onnx import helper, numpy_helper

    n = X86.vector_lanes_f32
    parts = [f"p{i}" for i in range(len(sizes))]
    nodes = [_conv("x", "w0", None, "c"), helper.make_node("Split", ["c", "sizes"], parts, axis=1)]
    inits = {"w0": _w(sum(sizes) * n, n, 1, 1)}
    for i, (p, k) in enumerate(zip(parts, sizes)):
        nodes.append(_conv(p, f"w{i + 1}", None, f"c{i}", pads=[1] * 4))
        inits[f"w{i + 1}"] = _w(n, k * n, 3, 3)
    total = "c0"
    for i in range(1, len(sizes)):
        nodes.append(helper.make_node("Add", [total, f"c{i}"], [f"s{i}"]))
        total = f"s{i}"
    nodes.append(helper.make_node("Identity", [total], ["y"]))
    m = _model(nodes, [1, n, 6, 6], inits)
    m.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64) * n, "sizes"))
    return m


def test_a_split_into_equal_parts_stays_packed():
    """Split at block edges into equal parts, the split becomes TVM's sections form, whose layout
    rule keeps the parts packed: the convs reading them take the split's block (the walk follows
    it), and no conversion is left around the split."""
    n = X86.vector_lanes_f32
    report, got, ref = run_onnx(_split_model([1, 1]), [(n, n), (None, n), (None, n)])
    assert report.details["splits_as_sections"] == 1 and "split lowered" not in report.summary, report.summary
    assert report.details["packed"] == 3 and report.details["conversions_after"] == 2, report.summary
    assert all(c["layouts"][0] == f"NCHW{n}c" for c in report.details["per_conv"]), report.details["per_conv"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_an_unequal_split_that_fails_beside_packed_convs_is_lowered_alone():
    """Split at block edges into unequal parts, TVM's layout inference gives a part 0 channels: the
    split is lowered with NCHW around it and every conv keeps its searched layout (nudenet's 64
    convs had all fallen back to uniform blocking)."""
    n = X86.vector_lanes_f32
    report, got, ref = run_onnx(_split_model([1, 2]), [(n, n), (n, n), (n, n)])
    assert report.details["packed"] == 3 and "relax.split lowered" in report.summary, report.summary
    assert "uniform" not in report.summary and "NCHW kept" not in report.summary, report.summary
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
