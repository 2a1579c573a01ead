"""opcompare: heavy nodes classified with their FLOPs, onnxruntime's renamed profile entries
resolved to the ONNX node, plan steps matched to nodes, and `pack bench --ops` end to end with
OpenVINO timed beside (times are never asserted, only that both sides placed the nodes)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

from packager.frontend.model import LoadedModel, TensorInfo
from packager.tools import opcompare
from support.helpers import run_pack


def _convs() -> LoadedModel:
    """3x3 conv 8->16 at 16x16, a depthwise 3x3, a 1x1 conv + Relu, a Gemm-free MatMul."""
    rng = np.random.default_rng(0)
    w = {"w1": (16, 8, 3, 3), "w2": (16, 1, 3, 3), "w3": (4, 16, 1, 1), "m": (16, 5)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c3", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["b"], name="dw", pads=[1, 1, 1, 1], group=16),
             helper.make_node("Conv", ["b", "w3"], ["c"], name="c1", strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "m5"], ["y"], name="mm")]
    inits = [nh.from_array(rng.standard_normal(s).astype(np.float32), k) for k, s in w.items()]
    inits.append(nh.from_array(rng.standard_normal((8, 5)).astype(np.float32), "m5"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return LoadedModel("m.onnx", m, 17, [TensorInfo("x", "float32", (1, 8, 16, 16))],
                       [TensorInfo("y", "float32", (1, 4, 8, 5))])


def test_heavy_nodes_are_classified_with_their_flops():
    nodes = {n.name: n for n in opcompare.heavy_nodes(_convs(), {"x": (1, 8, 16, 16)})}
    assert {k: n.cls for k, n in nodes.items()} == {"c3": "conv 3x3", "dw": "conv depthwise 3x3", "c1": "conv 1x1",
                                                  "mm": "matmul"}
    assert nodes["c3"].flops == 2 * 16 * 16 * 16 * 8 * 9 and nodes["c3"].desc == "3x3/1 8->16 @16x16"
    assert nodes["dw"].flops == 2 * 16 * 16 * 16 * 9 and nodes["c1"].out_elems == 4 * 8 * 8
    assert nodes["mm"].flops == 2 * (4 * 8 * 5) * 8


def test_profiled_names_resolve_through_onnxruntimes_renames():
    m = _convs()
    resolve = opcompare._resolver(m.proto, {"c3", "dw", "c1", "mm"})
    assert resolve("c3") == "c3"                 # its own name
    assert resolve("a_nchwc") == "c3"            # an NCHWc conv, named after its output
    assert resolve("r") == "c1"                  # Conv + Relu fused, named after the Relu's output
    assert resolve("ReorderOutput_7") is None    # an ORT-internal node


def test_nameless_nodes_resolve_to_the_keys_heavy_nodes_gives_them():
    m = _convs()
    for n in m.proto.graph.node:
        n.name = ""                              # ONNX allows it; hand-built and older exports do it
    keys = [n.name for n in opcompare.heavy_nodes(m, {"x": (1, 8, 16, 16)})]
    assert keys == ["Conv_0", "Conv_1", "Conv_2", "MatMul_4"]
    resolve = opcompare._resolver(m.proto, set(keys))
    assert resolve("a_nchwc") == "Conv_0" and resolve("r") == "Conv_2" and resolve("y") == "MatMul_4"


def test_onnxruntimes_separate_activations_count_with_the_conv_where_ours_fused_them():
    m = _convs()
    resolve = opcompare._resolver(m.proto, {"c3", "dw", "c1", "mm"})
    assert resolve("relu/QuickGeluFusion/") == "c1"          # a fused node, named after the one it replaced
    nodes = {n.name: n for n in opcompare.heavy_nodes(m, {"x": (1, 8, 16, 16)})}
    c1, c3 = nodes["c1"], nodes["c3"]
    silu = {"step": 0, "kernel": "fused_conv_sigmoid_multiply", "flops": c1.flops + 100 * c1.out_elems,
            "out_elems": c1.out_elems}
    bias = {"step": 1, "kernel": "fused_conv_add", "flops": c3.flops + c3.out_elems, "out_elems": c3.out_elems}
    assert opcompare._fuses_epilogue(c1, silu) and not opcompare._fuses_epilogue(c3, bias)
    c1.ort_ms = c3.ort_ms = 1.0
    other = {"MaxPool": 0.5}
    opcompare._count_epilogues(list(nodes.values()), {"c1"}, {("c1", "QuickGelu"): 0.25, ("c3", "Add"): 0.125},
                               other)
    assert c1.ort_ms == 1.25 and c1.ort_epilogue_ms == 0.25 and c3.ort_ms == 1.0   # ours did not fuse c3's
    assert other == {"MaxPool": 0.5, "Add": 0.125}


def test_steps_match_nodes_in_order_within_padding_and_epilogues():
    nodes = opcompare.heavy_nodes(_convs(), {"x": (1, 8, 16, 16)})
    f = {n.name: n.flops for n in nodes}
    steps = [{"step": 0, "kernel": "k_c3", "ms": 1.0, "flops": f["c3"] + 4096, "out_elems": 16 * 256},
             {"step": 1, "kernel": "k_copy", "ms": 0.1, "flops": 0, "out_elems": 16 * 256},
             {"step": 2, "kernel": "k_dw", "ms": 0.5, "flops": f["dw"], "out_elems": 16 * 256},
             {"step": 3, "kernel": "k_c1", "ms": 0.2, "flops": int(f["c1"] * 1.5), "out_elems": 8 * 64}]  # 4 -> 8 ch
    opcompare.match(nodes, steps)
    got = {n.name: (n.kernel, n.ours_ms) for n in nodes}
    assert got == {"c3": ("k_c3", 1.0), "dw": ("k_dw", 0.5), "c1": ("k_c1", 0.2), "mm": ("", None)}
    for n, ort in zip(nodes, (0.5, 0.5, 0.4, 0.1)):
        n.ort_ms = ort
    classes = opcompare.summarize(nodes)
    assert classes["conv 3x3"]["ratio"] == 2.0 and classes["matmul"]["compared"] == 0
    assert [w["name"] for w in opcompare.worst({"nodes": [vars(n) | {"ratio": n.ratio} for n in nodes]})] == ["c3"]


def test_the_other_ops_are_each_sides_time_outside_the_heavy_nodes():
    nodes = opcompare.heavy_nodes(_convs(), {"x": (1, 8, 16, 16)})
    nodes[0].kernel = "k_c3"
    steps = [{"kernel": "k_c3", "ms": 1.0}, {"kernel": "take", "ms": 0.5}, {"kernel": "take", "ms": 0.25},
             {"kernel": "add", "ms": 0.1}]
    other = opcompare.other_ops(nodes, steps, {"Resize": 0.2, "Add": 0.05})
    assert other["ours_ms"] == 0.85 and other["ort_ms"] == 0.25 and other["ratio"] == 0.85 / 0.25
    assert other["ours_top"] == [["take", 0.75], ["add", 0.1]] and other["ort_top"][0] == ["Resize", 0.2]


def test_a_step_of_other_spatial_dims_does_not_carry_a_conv():
    """A 16-channel conv at 16x16 and a step with 4x its elements (16 channels at 32x32) and 4x
    its FLOPs: within the channel-padding slack, but another conv; the node's own step, later and
    blocked NCHW4c, carries it."""
    nodes = [n for n in opcompare.heavy_nodes(_convs(), {"x": (1, 8, 16, 16)}) if n.name == "c3"]
    n = nodes[0]
    assert n.spatial == (16, 16)
    steps = [{"step": 0, "kernel": "other", "ms": 1.0, "flops": n.flops * 4, "out_elems": n.out_elems * 4,
              "shape": (1, 16, 32, 32)},
             {"step": 1, "kernel": "mine", "ms": 0.2, "flops": n.flops, "out_elems": n.out_elems,
              "shape": (1, 4, 16, 16, 4)}]
    opcompare.match(nodes, steps)
    assert n.kernel == "mine"
    n.kernel = ""                       # same map, but 4x the channels: a wider conv, not padding
    steps[0]["shape"] = (1, 64, 16, 16)
    opcompare.match(nodes, steps)
    assert n.kernel == "mine"


def test_a_winograd_convs_three_steps_carry_the_conv():
    """Input transform -> GEMM -> output transform (the conv's output, far fewer FLOPs): one step
    carrying the conv, its time the three steps' sum; other steps stay as they are."""
    n = [n for n in opcompare.heavy_nodes(_convs(), {"x": (1, 8, 16, 16)}) if n.name == "c3"][0]
    steps = [{"step": 0, "kernel": "winograd_input", "ms": 0.2, "flops": 10, "out_elems": 36 * 16 * 8, "args": [0, 1]},
             {"step": 1, "kernel": "matmul", "ms": 0.5, "flops": 100, "out_elems": 36 * 16 * 16, "args": [1, 9, 2]},
             {"step": 2, "kernel": "fused_winograd_output_add", "ms": 0.1, "flops": 10, "out_elems": n.out_elems,
              "args": [2, 8, 3], "shape": (1, 1, 16, 16, 16)},
             {"step": 3, "kernel": "relu", "ms": 0.05, "flops": 0, "out_elems": n.out_elems, "args": [3, 4]}]
    merged = opcompare._winograd_convs(steps)
    assert [s["kernel"] for s in merged] == ["fused_winograd_output_add", "relu"]
    opcompare.match([n], merged)
    assert n.kernel == "fused_winograd_output_add" and n.ours_ms == pytest.approx(0.8)
    pointwise = opcompare.HeavyNode("p", "Conv", "conv 1x1", "1x1/1 8->16 @16x16", n.flops // 9, n.out_elems,
                                    n.spatial, n.channels)          # same output, listed first
    opcompare.match([pointwise, n], merged)
    assert pointwise.ours_ms is None and n.kernel == "fused_winograd_output_add"


@pytest.mark.slow
def test_bench_ops_places_every_conv_of_the_cnn_sample(cnn_copy, tmp_path):
    out = tmp_path / "bench.json"
    r = run_pack("bench", cnn_copy, "--threads", "1", "--iters", "3", "--rounds", "1", "--warmup", "1", "--ops",
                 "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    prof = json.loads(out.read_text())["profiles"][0]
    ops = prof["ops"]
    convs = [n for n in ops["nodes"] if n["op"] == "Conv"]
    assert len(convs) == 5 and all(n["ort_ms"] and n["ours_ms"] and n["kernel"] for n in convs)
    assert sum(c["compared"] for k, c in ops["classes"].items() if k.startswith("conv")) == 5
    assert "heavy nodes vs onnxruntime's profiler" in r.stdout
    assert ops["other"]["ort_ms"] > 0 and "other ops (not conv/matmul)" in r.stdout    # the cnn's pooling, adds
    assert prof["openvino"]["median_ms"] > 0 and prof["variants"][0]["ratio_openvino"] > 0   # a dev dependency
    assert "ours / OpenVINO" in r.stdout
