"""The derive pass on a Relax graph: a ConvTranspose is replaced by its derived Matmul +
eOperators when that is timed (or, for a target that does not run here, estimated) faster, and
the rewritten graph computes what the original did; sites this version does not derive are
refused with the reason."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from support.kernel_cases import host_target, scheduler
from packager.optimize.derive.graph import decide, derive_graph, rewrite
from packager.optimize.derive.sites import site_key
from packager.spec import TargetSpec
from packager.targets import resolve

torch = pytest.importorskip("torch")


def _relax(net, shape):
    from tvm.relax.frontend.onnx import from_onnx
    import io
    import onnx
    buf = io.BytesIO()
    torch.onnx.export(net.eval(), torch.randn(shape), buf, dynamo=False, opset_version=17, input_names=["x"])
    return from_onnx(onnx.load_from_string(buf.getvalue()), shape_dict={"x": list(shape)}, keep_params_in_input=False)


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _ops(mod):
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(getattr(getattr(e, "op", None), "name", None)))
    return names


def _weight_gemms(mod) -> list:
    """The layout pass's sites among the matmuls: those whose B is a constant it can put in panels."""
    from packager.optimize.layout.matmul import matmul_site
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call) and
                                    getattr(e.op, "name", None) == "relax.matmul" else None)
    return [matmul_site(c) for c in calls]


def _generator():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.ConvTranspose2d(16, 8, 4, 2, 1), torch.nn.ReLU(),
                               torch.nn.ConvTranspose2d(8, 4, 4, 2, 1))


def test_stride2_conv_transposes_are_derived_and_compute_the_same(tmp_path):
    """arm64 does not run here: the decision is the roofline estimate (4x fewer multiply-adds)."""
    arm = resolve(TargetSpec("arm64", {}, "t"))
    mod = _relax(_generator(), (1, 16, 5, 5))
    out, report = derive_graph(mod, scheduler(arm, tmp_path, measure=False))
    sites = report.details["sites"]
    assert [s["taken"] for s in sites] == [True, True] and all(not s["measured"] for s in sites)
    assert all(s["derived_ms"] < s["original_ms"] for s in sites)
    assert "relax.nn.conv2d_transpose" not in _ops(out) and "relax.matmul" in _ops(out)
    x = np.random.default_rng(0).standard_normal((1, 16, 5, 5)).astype("float32")
    want = _generator()(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(_run(out, x), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(mod, x), want, rtol=1e-4, atol=1e-4)
    assert "2 of 2 operator shape(s) rewritten" in report.summary and "pruned by fingerprint" in report.summary


def test_measured_decisions_name_both_times(tmp_path):
    """InfoGAN's third and fourth layers' shapes (tiny ones are refused on the estimate alone)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.ConvTranspose2d(256, 128, 4, 2, 1), torch.nn.ConvTranspose2d(128, 64, 4, 2, 1))
    out, report = derive_graph(_relax(net, (1, 256, 4, 4)), scheduler(host_target(), tmp_path, measure=True))
    sites = report.details["sites"]
    assert len(sites) == 2
    for s in sites:
        assert s["original_ms"] > 0 and s["derived_ms"] > 0
        if not s["measured"]:                   # estimated 1.5x slower: not worth timing
            assert not s["taken"] and s["why"] == "estimated slower"
            continue
        assert s["taken"] == (s["derived_ms"] < s["original_ms"])
        assert s["why"] == ("measured faster" if s["taken"] else "measured no faster")
    assert any(s["measured"] for s in sites)


def test_sites_this_version_does_not_derive_are_refused_with_the_reason(tmp_path):
    arm = resolve(TargetSpec("arm64", {}, "t"))
    grouped = torch.nn.ConvTranspose2d(8, 8, 4, 2, 1, groups=2)
    _, report = derive_graph(_relax(grouped, (1, 8, 4, 4)), scheduler(arm, tmp_path, measure=False))
    (site,) = report.details["sites"]
    assert not site["taken"] and "groups" in site["why"]
    stride1 = torch.nn.ConvTranspose2d(8, 8, 2, 1, 0)         # no zero insertion: nothing to save
    _, report = derive_graph(_relax(stride1, (1, 8, 1, 1)), scheduler(arm, tmp_path, measure=False))
    (site,) = report.details["sites"]
    assert not site["taken"] and site["why"] == "estimated no faster (not measured)"
    convs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 1), torch.nn.Conv2d(4, 4, 3, groups=2))
    _, report = derive_graph(_relax(convs, (1, 3, 8, 8)), scheduler(arm, tmp_path, measure=False), time_convs=True)
    assert [s["why"] for s in report.details["sites"]] == [
        "not searched: a conv is derived only where timed, at optimize.level 3", "a 1x1 conv is a matmul already",
        "groups > 1 (not derived in this version)"]
    assert "1 Conv shape(s) left: a 1x1 conv is a matmul already" in report.summary


def test_a_conv_is_timed_against_the_packed_conv_and_its_derived_program_computes_the_same(tmp_path):
    """At level 3 a 3x3 conv is searched and timed against the layout pass's packed conv; the
    derived Matmul + OffsetReduce, emitted whatever the decision, equals the conv."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(128, 16, 3, padding=2, dilation=2))
    mod = _relax(net, (1, 128, 14, 14))
    out, report = derive_graph(mod, scheduler(host_target(), tmp_path, measure=True), time_convs=True)
    sites = report.details["sites"]
    assert len(sites) == 2 and all(s["original_ms"] > 0 and s["derived_ms"] > 0 for s in sites)
    assert sites[0]["measured"], sites[0]                  # a ResNet-like 3x3 conv is close enough to time
    for s in sites:
        assert any(step.startswith("converge") for step in s["steps"])
        if s["measured"]:
            assert s["taken"] == (s["derived_ms"] < s["original_ms"])
        else:
            assert not s["taken"] and s["why"] == "estimated slower"
    _, again = derive_graph(mod, scheduler(host_target(), tmp_path, measure=True), time_convs=True)    # a rebuild replays
    assert [s["why"] for s in again.details["sites"]] == [s["why"] + " (from the tuning database)" for s in sites]
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    forced = {}
    for call in calls:
        if getattr(call.op, "name", None) == "relax.nn.conv2d":
            site = decide(call, scheduler(host_target(), tmp_path / "forced"), time_convs=True)
            forced[site_key(call)] = site
    assert len(forced) == 2 and all(s.program is not None for s in forced.values())
    derived = rewrite(mod, forced)
    assert "relax.nn.conv2d" not in _ops(derived) and "relax.matmul" in _ops(derived)
    x = np.random.default_rng(0).standard_normal((1, 128, 14, 14)).astype("float32")
    np.testing.assert_allclose(_run(derived, x), net(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)
    # the GEMM's weight is a constant, re-laid at build time: the layout pass puts it in the panels
    # the decision was timed with (a reshape left in the graph hid it: ResNet-18's 7x7 convs ran 0.77 ms, not 0.59)
    sites = _weight_gemms(derived)
    assert len(sites) == 2 and all(s is not None for s in sites), sites
    assert {(s.a, s.n) for s in sites} == {((196, 128), 9 * 128), ((196, 128), 9 * 16)}
