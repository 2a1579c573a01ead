"""Property-based checks of every CPU schedule a build without timing can ship (`measure: false`,
arm64 from x86, targets with no RPC device): random small models (1-D and 2-D convs of odd and
prime sizes, strides, padding, dilation, depthwise; then ReLU and a tail that reads the conv: a
max or average pool, a global pool, a 1x1 conv to few channels, a sum over channels; matmuls of
odd sizes; ConvTransposes, which the derive pass rewrites) go through the level-2 graph passes
untimed (layout, global fusion's reduction epilogues and row regions, derive), and every kernel's
candidates (Gensor's three best-ranked plans with and without padding per task, every rule that
fits) are run on this machine against the kernel's unscheduled loops.

The schedule check (check.py) would hide a wrong candidate from a package; this test looks at
the candidates themselves, so a wrong rule or plan fails here: before the reduction-epilogue
rule refused sliding windows, 8 of the first 12 pooled-conv examples failed (DNSMOS's defect: a
conv whose 2x2/2 pool global fusion merged, the window cut to one row by reverse_compute_at).
Kernel by kernel, against the unscheduled loops: graph rewrites (layout, derive) are checked by
the builds that verify against onnxruntime. Deterministic (derandomize=True)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from packager.codegen.graph import extract_graph
from packager.optimize.pipeline import optimize_graph
from packager.optimize.schedule.measure.check import disagreements
from packager.optimize.schedule.gensor.cpu_model import CpuSpace
from packager.optimize.schedule.measure.database import TuningDatabase
from packager.optimize.schedule.gensor.cpu import PAD_VARIANTS, RESTARTS, GensorCpu, with_pad_variants
from packager.optimize.schedule.gensor.walk import construct
from packager.optimize.schedule.gensor.workload import func_key
from packager.spec import OptimizeSpec
from support.kernel_cases import _imported, host_target

PROPERTIES = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# 8 of the first 12 pooled examples failed before the reduction-epilogue rule refused sliding windows
POOLED = settings(PROPERTIES, max_examples=10)
F = TensorProto.FLOAT
TAILS = ("maxpool", "avgpool", "globalpool", "conv1x1", "channel_sum", "none")


@st.composite
def conv_models(draw, pooled: bool = False) -> onnx.ModelProto:
    """x -> Conv (+ bias) -> Relu -> a tail reading the conv's output. `pooled`: a 2-D 3x3 conv
    with enough work per output for global fusion to merge the pooling after it."""
    rank = 2 if pooled else draw(st.sampled_from([2, 1, 2]))
    # pooled: channels and columns that tile whole (untimed, global fusion merges only those), rows any
    cin = draw(st.sampled_from([8, 16, 32]) if pooled else st.integers(2, 16))
    depthwise = not pooled and draw(st.sampled_from([False, False, True]))
    cout = cin if depthwise else draw(st.sampled_from([8, 16, 24, 32]) if pooled else st.integers(1, 24))
    k = 3 if pooled else draw(st.sampled_from([3, 1, 2]))
    stride, pad, dil = draw(st.integers(1, 2)), draw(st.integers(0, 1)), draw(st.integers(1, 2)) if k > 1 else 1
    lo = (k - 1) * dil + 1
    size = [draw(st.integers(max(lo, 5), 29)) for _ in range(rank)]
    if pooled:
        stride, dil = 1, 1
        size[-1] = draw(st.sampled_from([8, 10, 16, 20, 40])) + 2 * (1 - pad)
    tail = draw(st.sampled_from(("maxpool", "avgpool") if pooled else TAILS))
    rng = np.random.default_rng(len(size) * 1000 + cin * 37 + cout)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k] * rank, strides=[stride] * rank,
                              pads=[pad] * 2 * rank, dilations=[dil] * rank, group=cin if depthwise else 1),
             helper.make_node("Relu", ["c"], ["r"])]
    inits = {"w": rng.standard_normal((cout, 1 if depthwise else cin, *[k] * rank)).astype(np.float32),
             "b": rng.standard_normal(cout).astype(np.float32)}
    out_size = [(s + 2 * pad - lo) // stride + 1 for s in size]
    if tail in ("maxpool", "avgpool") and min(out_size) >= 2:
        win = draw(st.integers(2, min(3, min(out_size))))
        step = draw(st.integers(2, win) if pooled else st.integers(1, 2))
        nodes.append(helper.make_node("MaxPool" if tail == "maxpool" else "AveragePool", ["r"], ["y"],
                                      kernel_shape=[win] * rank, strides=[step] * rank))
    elif tail == "globalpool":
        nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["y"]))
    elif tail == "conv1x1":
        inits["w2"] = rng.standard_normal((draw(st.integers(1, 3)), cout, *[1] * rank)).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["r", "w2"], ["y"]))
    elif tail == "channel_sum":
        nodes.append(helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=1))
        inits["axes"] = np.array([1], np.int64)
    else:
        nodes[-1] = helper.make_node("Relu", ["c"], ["y"])
    return _model(nodes, {"x": [1, cin, *size]}, inits)


@st.composite
def matmul_models(draw) -> onnx.ModelProto:
    """A matmul of odd or prime sizes (batched or not), a ConvTranspose, or a reduction of rows."""
    kind = draw(st.sampled_from(["matmul", "conv_transpose", "reduce"]))
    rng = np.random.default_rng(7)
    if kind == "matmul":
        batch = draw(st.sampled_from([[], [2], [2, 3]]))
        m, k, n = draw(st.integers(1, 67)), draw(st.integers(1, 53)), draw(st.integers(1, 61))
        return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [*batch, m, k]},
                      {"w": rng.standard_normal((k, n)).astype(np.float32)})
    if kind == "conv_transpose":
        cin, cout, s = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(2, 11))
        stride, k = draw(st.integers(1, 2)), draw(st.integers(2, 4))
        return _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[stride, stride])],
                      {"x": [1, cin, s, s]}, {"w": rng.standard_normal((cin, cout, k, k)).astype(np.float32)})
    rows, cols = draw(st.integers(1, 41)), draw(st.integers(2, 97))
    op = draw(st.sampled_from(["ReduceMean", "ReduceMax", "Softmax"]))
    node = helper.make_node(op, ["x"], ["y"], axis=-1) if op == "Softmax" else \
        helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    return _model([node], {"x": [rows, cols]}, {} if op == "Softmax" else {"axes": np.array([-1], np.int64)})


def _model(nodes, inputs: dict, inits: dict) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(v, n) for n, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def _candidates(g: GensorCpu, func) -> dict[str, object]:
    """Every schedule an untimed build could take for `func`: Gensor's best-ranked plans (with
    their padding-per-task variants) and every rule that fits."""
    out = {}
    wl = g.workload(func)
    if wl is not None:
        wl = replace(wl, key=func_key(func, g.target_key))
        space = CpuSpace(wl, g.hw)
        plans = [(est, space.to_plan(s)) for est, s in construct(space, 0, restarts=RESTARTS)[:3]]
        for i, (_, plan) in enumerate(with_pad_variants(plans, wl, PAD_VARIANTS)):
            try:
                out[f"gensor plan {i} ({plan})"] = g.lower(func, plan)
            except Exception:  # noqa: BLE001 - a plan the primitives refuse is not a candidate
                continue
    for sched, info in g.rules.candidates(func):
        out[f"rules: {info.summary()}"] = sched
    return out


def _check(model: onnx.ModelProto, db) -> None:
    target = host_target()
    mod, inputs = _imported(model)
    opt = OptimizeSpec(level=2, measure=False, database=db)
    mod, _ = optimize_graph(mod, opt, target)
    graph = extract_graph(mod, [i.name for i in inputs], ["y"])
    g = GensorCpu(target, TuningDatabase(db), measure=False, top_k=1)
    wrong = []
    for call in graph.calls:
        func = graph.kernels[call.kernel]
        cands = _candidates(g, func)
        verdicts = disagreements({label: (sched, func) for label, sched in cands.items()})
        wrong += [f"{call.kernel}: {label}: {v if isinstance(v, str) else 'disagrees'}"
                  for label, v in verdicts.items() if v is not False]
    assert not wrong, "\n".join(wrong) + "\n" + onnx.printer.to_text(model.graph)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("untimed-db")


@PROPERTIES
@given(model=conv_models())
def test_every_untimed_conv_schedule_computes_what_its_loops_compute(model, db):
    _check(model, db)


@POOLED
@given(model=conv_models(pooled=True))
def test_every_untimed_schedule_of_a_pooled_conv_computes_what_its_loops_compute(model, db):
    _check(model, db)


@PROPERTIES
@given(model=matmul_models())
def test_every_untimed_matmul_and_row_schedule_computes_what_its_loops_compute(model, db):
    _check(model, db)
