"""Node by node against onnxruntime: which convolutions and matmuls of a model are slow.

A model-level ratio says a package is slower; it does not say where. This module puts our time
for each heavy ONNX node (Conv, ConvTranspose, MatMul, Gemm) beside onnxruntime's, both profiled
in alternating rounds (pack bench's --rounds), each node's and step's fastest round kept (on a VM
whose host lends the second core away now and then, one round ran every kernel at 1-thread speed):

- onnxruntime: its profiler's per-node kernel times. Its optimizer renames what it rewrites (an
  NCHWc conv is named after its output tensor plus `_nchwc`, a conv with a fused activation after
  the activation's output), so a profiled name is resolved to the ONNX node by name, else by the
  tensor it writes, then back through element-wise nodes to the heavy node that feeds them.
  Its element-wise nodes after a heavy node (QuickGelu for SiLU, HardSwish, a residual Add) count
  with that node where our step computes them in its epilogue: the same work on both sides.
- ours: packrt-run's per-step times. A plan step carries a heavy node when its output holds as
  many elements (a conv's: its spatial dims in order, its channels padded by less than a block)
  and its kernel as many FLOPs (up to padding and fused epilogues: a depthwise conv's SiLU costs
  more FLOPs than the conv), else, for what is left, as
  many FLOPs alone (a conv merged with the pooling after it); nodes and steps are matched in
  graph order. (With a 4x slack on elements alone, a 64-channel conv at 80x80 passed for one at
  40x40, and a 64-channel 3x3 conv for a 16-channel 1x1 conv at the same size.) A Winograd
  conv's input transform, GEMM and output transform are one step, placed by its output alone.

A node either side cannot place (merged into a bigger kernel, an ORT-internal node) is listed
with the time that side has, never guessed. Classes (3x3 conv, 1x1 conv, depthwise, ...) sum
the nodes both sides placed, so their ratio compares like with like. "other ops" is the rest of
each side's time (onnxruntime's other nodes, our steps carrying no heavy node), with the largest
op types and kernels named.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from ..frontend.attrs import attr
from ..frontend.model import LoadedModel
from ..frontend.partition import tensor_types

HEAVY = ("Conv", "ConvTranspose", "MatMul", "Gemm")
ORT_HEAVY = {"Conv", "FusedConv", "NhwcFusedConv", "ConvTranspose", "MatMul", "FusedMatMul", "Gemm", "FusedGemm"}
OUT_SLACK = 4.0           # our output elements over the node's: channels padded to a block (4 -> 16)
BLOCK = 16                # a conv's output channels are padded by less than one block (16 lanes at most)
FLOP_SLACK = 1.8          # our kernel FLOPs over the node's beyond that padding: fused epilogues
EPILOGUE_FLOPS = 128      # and per output element: an activation's polynomial (SiLU's fast sigmoid ~100)
SLOW = 1.2                # a node over this x onnxruntime's time counts as slow (issue 45's bar)
# onnxruntime's element-wise nodes: after a heavy node they are its epilogue, which we fuse
FUSED_NAME = re.compile(r"/\w+Fusion/?$")
EPILOGUE_OPS = {"QuickGelu", "Sigmoid", "Mul", "Add", "Sum", "Sub", "Div", "HardSwish", "HardSigmoid", "Relu",
                "Clip", "LeakyRelu", "PRelu", "Tanh", "Gelu", "FastGelu", "BiasGelu", "Elu", "Selu", "Softplus", "Erf"}
OTHER = "other ops"       # the time outside the heavy nodes, each side's
OTHER_TOP = 4             # its largest kernels / op types named in the report


@dataclass
class HeavyNode:
    """One Conv/ConvTranspose/MatMul/Gemm of the model, with its work at the bound shapes."""

    name: str
    op: str
    cls: str                 # "conv 3x3", "conv 1x1", "conv depthwise 3x3", "matmul", ...
    desc: str                # shapes in one line: "3x3/1 128->128 @56x56"
    flops: int
    out_elems: int
    spatial: tuple[int, ...] = ()       # a conv's output dims after the channels
    channels: int = 0                   # a conv's output channels
    ort_ms: float | None = None
    ours_ms: float | None = None
    kernel: str = ""
    ort_epilogue_ms: float = 0.0        # onnxruntime's element-wise nodes after it, in ort_ms when we fused ours

    @property
    def ratio(self) -> float | None:
        return self.ours_ms / self.ort_ms if self.ours_ms and self.ort_ms else None


def heavy_nodes(model: LoadedModel, shapes: dict[str, tuple[int, ...]]) -> list[HeavyNode]:
    """The model's heavy nodes in graph order, with class and FLOPs from the bound shapes (a node
    whose shapes stay unknown is left out)."""
    types = tensor_types(model, shapes)

    def shape(name: str) -> tuple[int, ...] | None:
        t = types.get(name)
        return tuple(t[1]) if t and t[1] is not None and all(isinstance(d, int) for d in t[1]) else None

    out = []
    for i, n in enumerate(model.proto.graph.node):
        if n.op_type not in HEAVY or not n.output:
            continue
        ins, y = [shape(x) if x else None for x in n.input], shape(n.output[0])
        if y is None or any(s is None for s in ins[:2]):
            continue
        cls, desc, flops = _classify(n, ins, y)
        conv = n.op_type.startswith("Conv")
        out.append(HeavyNode(node_key(n, i), n.op_type, cls, desc, flops, math.prod(y),
                             tuple(y[2:]) if conv else (), y[1] if conv else 0))
    return out


def node_key(n: onnx.NodeProto, index: int) -> str:
    """A node's name, or for a nameless node (allowed by ONNX, common in hand-built and older
    exports) its op type and graph index: the key both runtimes' times are joined on."""
    return n.name or f"{n.op_type}_{index}"


def _classify(n: onnx.NodeProto, ins: list, y: tuple[int, ...]) -> tuple[str, str, int]:
    a, b = ins[0], ins[1]
    if n.op_type in ("MatMul", "Gemm"):
        k = a[0] if n.op_type == "Gemm" and attr(n, "transA", 0) else a[-1]
        return "matmul", f"{list(a)} x {list(b)}", 2 * math.prod(y) * k
    kernel, group = tuple(b[2:]), attr(n, "group", 1)
    kxk = "x".join(map(str, kernel))
    stride = attr(n, "strides", [1] * len(kernel))
    desc = f"{kxk}/{'x'.join(map(str, stride)) if len(set(stride)) > 1 else stride[0]} {a[1]}->{y[1]} " \
           f"@{'x'.join(map(str, y[2:]))}" + (f" g{group}" if group > 1 else "")
    if n.op_type == "ConvTranspose":
        return f"conv transpose {kxk}", desc, 2 * math.prod(a) * b[1] * math.prod(kernel)
    flops = 2 * math.prod(y) * b[1] * math.prod(kernel)
    dims = "" if len(kernel) == 2 else f"{len(kernel)}d "
    if group > 1 and group == a[1] and b[1] == 1:
        return f"conv {dims}depthwise {kxk}", desc, flops
    return (f"conv {dims}grouped {kxk}" if group > 1 else f"conv {dims}{kxk}"), desc, flops


def ort_node_ms(model_path: Path, inputs: dict[str, np.ndarray], threads: int, runs: int,
                nodes: list[HeavyNode], proto: onnx.ModelProto) -> tuple[dict[str, float], float, dict[str, float]]:
    """onnxruntime's mean kernel ms per heavy node over `runs` profiled runs (after one untimed),
    its mean total of all node kernel times per run, and its mean ms per op type of the nodes
    that are not heavy (Resize, pooling, element-wise, layout reorders)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_profiling = True
    if threads:
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    with tempfile.TemporaryDirectory(prefix="pack-ortprof-") as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, inputs)
        events = json.loads(Path(sess.end_profiling()).read_text())
    resolve = _resolver(proto, {n.name for n in nodes})
    per: dict[str, float] = {}
    other: dict[str, float] = {}
    total, seen_runs = 0.0, {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        name = e["name"][:-len("_kernel_time")]
        seen_runs[name] = seen_runs.get(name, 0) + 1
        ms = e["dur"] / 1e3
        if seen_runs[name] == 1:
            continue                                      # the first run is a warm-up
        total += ms
        op = e.get("args", {}).get("op_name", "?")
        node = resolve(name) if op in ORT_HEAVY or op in EPILOGUE_OPS else None
        key = node if op in ORT_HEAVY else (node, op)     # (node, op): an epilogue, see compare
        if node is not None:
            per[key] = per.get(key, 0.0) + ms
        elif op not in ORT_HEAVY:
            other[op] = other.get(op, 0.0) + ms
    return {k: v / runs for k, v in per.items()}, total / runs, {k: v / runs for k, v in other.items()}


def _resolver(proto: onnx.ModelProto, heavy: set[str]):
    """profiled name -> heavy ONNX node name (or None): by node name, else by the tensor it
    writes (`_nchwc` stripped), then up through single-input-from-a-node element-wise nodes."""
    nodes = list(proto.graph.node)
    key = [node_key(n, i) for i, n in enumerate(nodes)]
    by_name = {n.name: i for i, n in enumerate(nodes) if n.name}
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}

    def resolve(name: str) -> str | None:
        name = FUSED_NAME.sub("", name)          # "node_silu/QuickGeluFusion/": the node it replaced
        at = by_name.get(name, producer.get(name.removesuffix("_nchwc"), producer.get(name)))
        for _ in range(3):                       # Conv -> Add -> Relu fused into one ORT node
            if at is None or key[at] in heavy:
                break
            ups = [producer[i] for i in nodes[at].input if i in producer]
            at = next((u for u in ups if key[u] in heavy), ups[0] if len(ups) == 1 else None)
        return key[at] if at is not None and key[at] in heavy else None
    return resolve


def our_steps(plan: dict, steps: list[dict], profile: int = 0) -> list[dict]:
    """Each plan step of the profile with its kernel, mean ms, output elements and kernel FLOPs."""
    prof = plan["profiles"][profile]
    kernels = plan["kernels"]
    ms = {s["step"]: s["ms"] for s in steps}
    out = []
    for i, st in enumerate(prof["steps"]):
        if st.get("op") != "kernel":
            continue
        k = kernels[st["kernel"]]
        y = prof["tensors"][st["args"][-1]]
        out.append({"step": i, "kernel": k["name"], "ms": ms.get(i, 0.0), "flops": k.get("flops", 0),
                    "out_elems": math.prod(y["shape"]), "shape": tuple(y["shape"]), "args": st["args"]})
    return _winograd_convs(out)


def _winograd_convs(steps: list[dict]) -> list[dict]:
    """A Winograd conv's three steps (input transform -> GEMM -> output transform, which writes the
    conv's output) as one step carrying the conv, its time their sum (optimize/winograd)."""
    by_output = {s["args"][-1]: s for s in steps}
    merged: set[int] = set()
    for s in steps:
        if "winograd_output" not in s["kernel"]:
            continue
        gemm = by_output.get(s["args"][0])
        first = by_output.get(gemm["args"][0]) if gemm is not None else None
        if first is None or "winograd_input" not in first["kernel"]:
            continue
        s["ms"] += gemm["ms"] + first["ms"]
        s["winograd"] = True
        merged |= {gemm["step"], first["step"]}
    return [s for s in steps if s["step"] not in merged]


def _holds(n: HeavyNode, s: dict) -> bool:
    """The step's output has the conv's spatial dims in order (NCHW, NHWC and NCHW{c} all do)
    and its channels padded by less than a block; true where either side is unknown."""
    shape = s.get("shape")
    if not n.spatial or not shape:
        return True
    k = len(n.spatial)
    padded = s["out_elems"] * n.channels / n.out_elems
    return n.channels <= padded < n.channels + BLOCK and (math.prod(n.spatial) == 1 or   # 1x1 maps: a matmul
        any(tuple(shape[i:i + k]) == n.spatial for i in range(len(shape) - k + 1)))


def _winograd_shaped(n: HeavyNode) -> bool:
    """A node optimize/winograd can have rewritten: a dense (ungrouped) 3x3 stride-1 conv. Without
    this a 1x1 conv beside it with the same output (squeezenet's expand pair) took its steps."""
    return n.cls == "conv 3x3" and n.desc.startswith("3x3/1 ") and " g" not in n.desc


def _fuses_epilogue(n: HeavyNode, s: dict) -> bool:
    """The step computes more than the node and its bias: an activation or an add fused after it
    (a Winograd step: an op named after its output transform's bias add)."""
    if s.get("winograd"):
        return bool(re.search(r"winograd_output\d*_(?!add\d*$)", s["kernel"]))
    padded = max(s["out_elems"] / n.out_elems, 1.0)
    return s["flops"] - n.flops * padded > 1.5 * s["out_elems"]


def match(nodes: list[HeavyNode], steps: list[dict]) -> set[str]:
    """Give each node the step that carries it (see the module doc), in graph order. A second
    pass places what is left by FLOPs alone: a conv whose output a reduction epilogue consumes
    (global pooling) writes a smaller tensor than the node but does the node's work. Returns the
    nodes whose step fused an epilogue."""

    def same_output(n: HeavyNode, s: dict) -> bool:
        padded = s["out_elems"] / n.out_elems
        if s.get("winograd"):                   # fewer FLOPs by design: a 3x3 stride-1 dense conv
            return 1 <= padded <= OUT_SLACK and _holds(n, s) and _winograd_shaped(n)
        most = FLOP_SLACK * padded * n.flops + EPILOGUE_FLOPS * s["out_elems"]
        return 1 <= padded <= OUT_SLACK and _holds(n, s) and 0.9 * n.flops <= s["flops"] <= most

    def same_work(n: HeavyNode, s: dict) -> bool:
        return not s.get("winograd") and 0.9 <= s["flops"] / n.flops <= FLOP_SLACK

    placed: dict[int, int] = {}                 # node index -> step index
    for fits in (same_output, same_work):
        pos = 0
        for i, n in enumerate(nodes):
            if i in placed or not n.flops:
                pos = placed.get(i, pos - 1) + 1
                continue
            for j in list(range(pos, len(steps))) + list(range(pos)):
                if j not in placed.values() and fits(n, steps[j]):
                    placed[i], pos = j, j + 1
                    n.ours_ms, n.kernel = steps[j]["ms"], steps[j]["kernel"]
                    break
    return {nodes[i].name for i, j in placed.items() if _fuses_epilogue(nodes[i], steps[j])}


def summarize(nodes: list[HeavyNode]) -> dict[str, dict]:
    """Per class: nodes, nodes both sides placed, how many of those are over SLOW x onnxruntime's
    time, and their summed ms and ratio."""
    out: dict[str, dict] = {}
    for n in nodes:
        c = out.setdefault(n.cls, {"nodes": 0, "compared": 0, "slow": 0, "ort_ms": 0.0, "ours_ms": 0.0})
        c["nodes"] += 1
        if n.ratio is not None:
            c["compared"] += 1
            c["slow"] += n.ratio > SLOW
            c["ort_ms"] += n.ort_ms
            c["ours_ms"] += n.ours_ms
    for c in out.values():
        c["ratio"] = c["ours_ms"] / c["ort_ms"] if c["ort_ms"] else None
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ort_ms"]))


def fastest_ort(rounds: list[tuple[dict[str, float], float, dict[str, float]]]):
    """ort_node_ms's results of several rounds as one: each node's, op type's and the total's
    fastest round (a round another process slowed says nothing about the node)."""
    per: dict[str, float] = {}
    other: dict[str, float] = {}
    for p, _, o in rounds:
        for mine, theirs in ((per, p), (other, o)):
            for k, v in theirs.items():
                mine[k] = min(mine.get(k, v), v)
    return per, min(t for _, t, _ in rounds), other


def fastest_steps(rounds: list[list[dict]]) -> list[dict]:
    """packrt-run's per-step times of several profiled rounds as one: each step's fastest round."""
    best: dict[int, dict] = {}
    for steps in rounds:
        for s in steps:
            if s["step"] not in best or s["ms"] < best[s["step"]]["ms"]:
                best[s["step"]] = s
    return [best[k] for k in sorted(best)]


def compare(model: LoadedModel, model_path: Path, shapes: dict[str, tuple[int, ...]], inputs: dict[str, np.ndarray],
            plan: dict, steps: list[dict], threads: int, runs: int, profile: int = 0,
            ort: tuple[dict, float, dict[str, float]] | None = None) -> dict:
    """The report's `ops` entry: every heavy node with both times, the classes, the totals.
    `ort`: onnxruntime's node times already profiled (fastest_ort; keyed by node, and by (node,
    op) for the element-wise nodes after it), else one profiled run here."""
    nodes = heavy_nodes(model, shapes)
    ort_ms, ort_total, ort_other = ort or ort_node_ms(model_path, inputs, threads, runs, nodes, model.proto)
    for n in nodes:
        n.ort_ms = ort_ms.get(n.name)
    ours = our_steps(plan, steps, profile)
    fused = match(nodes, ours)
    ort_other = dict(ort_other)                  # the epilogues our steps did not fuse join it
    _count_epilogues(nodes, fused, ort_ms, ort_other)
    return {"classes": summarize(nodes), "nodes": [asdict(n) | {"ratio": n.ratio} for n in nodes],
            "other": other_ops(nodes, ours, ort_other),
            "ort_total_ms": ort_total, "ours_total_ms": sum(s["ms"] for s in steps)}


def _count_epilogues(nodes: list[HeavyNode], fused: set[str], ort_ms: dict, ort_other: dict[str, float]) -> None:
    """onnxruntime runs a conv's SiLU, HardSwish or residual Add as nodes of their own (QuickGelu
    ...) where our kernel computes them in the conv's epilogue: a node whose step fused an epilogue
    is compared with its onnxruntime node plus those; elsewhere they stay onnxruntime's other ops."""
    by_name = {n.name: n for n in nodes}
    for key, ms in ort_ms.items():
        if not isinstance(key, tuple):
            continue
        n = by_name.get(key[0])
        if n is not None and n.name in fused and n.ort_ms is not None:
            n.ort_ms += ms
            n.ort_epilogue_ms += ms
        else:
            ort_other[key[1]] = ort_other.get(key[1], 0.0) + ms


def other_ops(nodes: list[HeavyNode], ours: list[dict], ort_other: dict[str, float]) -> dict:
    """Everything but the heavy nodes: onnxruntime's non-heavy nodes (by op type) against our
    steps that carry no heavy node (by kernel), with the largest of each. A Resize, a pooling or
    a chain of element-wise ops losing time shows here, where no heavy node names it (LR-ASPP's
    bilinear upsamples were 3.8 ms of our 11.5 against onnxruntime's 0.5)."""
    carried = {n.kernel for n in nodes if n.kernel}
    rest = [s for s in ours if s["kernel"] not in carried]
    by_kernel: dict[str, float] = {}
    for s in rest:
        by_kernel[s["kernel"]] = by_kernel.get(s["kernel"], 0.0) + s["ms"]
    ours_ms, ort_ms = sum(by_kernel.values()), sum(ort_other.values())
    return {"ours_ms": ours_ms, "ort_ms": ort_ms, "ratio": ours_ms / ort_ms if ort_ms else None,
            "ours_top": _largest(by_kernel), "ort_top": _largest(ort_other)}


def _largest(ms: dict[str, float]) -> list[list]:
    """The OTHER_TOP largest [name, ms] pairs."""
    return [[k, v] for k, v in sorted(ms.items(), key=lambda kv: -kv[1])[:OTHER_TOP]]


def worst(ops: dict, limit: int = 3) -> list[dict]:
    """The nodes costing the most time over onnxruntime's (ours - ORT), both sides placed."""
    rows = [n for n in ops["nodes"] if n["ratio"] is not None and n["ours_ms"] > n["ort_ms"]]
    return sorted(rows, key=lambda n: n["ort_ms"] - n["ours_ms"])[:limit]


def print_ops(ops: dict, log, top: int) -> None:
    """Per class (ours / ORT over the nodes both placed), then the `top` nodes losing most time."""
    log(f"  heavy nodes vs onnxruntime's profiler (its node kernels {ops['ort_total_ms']:.3f} ms/run, "
        f"our steps {ops['ours_total_ms']:.3f} ms/run):")
    for cls, c in ops["classes"].items():
        ratio = f"{c['ratio']:5.2f}x" if c["ratio"] is not None else "    -"
        log(f"    {cls:26s} {c['compared']:3d}/{c['nodes']:<3d} nodes  ours {c['ours_ms']:8.3f} ms  "
            f"ORT {c['ort_ms']:8.3f} ms  {ratio}  ({c['slow']} over {SLOW}x)")
    o = ops.get("other")
    if o:
        ratio = f"{o['ratio']:5.2f}x" if o["ratio"] is not None else "    -"
        log(f"    {OTHER + ' (not conv/matmul)':26s}          ours {o['ours_ms']:8.3f} ms  ORT {o['ort_ms']:8.3f} ms  "
            f"{ratio}  (ours: {_names(o['ours_top'])}; ORT: {_names(o['ort_top'])})")
    for n in worst(ops, top):
        log(f"    worst: {n['name']} ({n['cls']} {n['desc']}) {n['ours_ms']:.3f} vs {n['ort_ms']:.3f} ms "
            f"{n['ratio']:.2f}x  [{n['kernel']}]")


def _names(top: list) -> str:
    return ", ".join(f"{name[:40]} {ms:.3f}" for name, ms in top) or "none"
