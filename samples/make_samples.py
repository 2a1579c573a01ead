"""Write the bundled sample models (random weights, fixed seed) next to their specs.

The models are generated rather than committed: they are deterministic, small, and a
fresh checkout makes them in about a second.  Usage: python samples/make_samples.py
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
IR_VERSION = 8  # every onnxruntime release we support accepts IR 8


class GraphBuilder:
    """Tiny helper so the sample graphs read like the networks they describe."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def weight(self, prefix: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return self.const(prefix, (self.rng.standard_normal(shape) * s).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        base = self.name(op_type.lower())
        outs = [base] if n_out == 1 else [f"{base}_o{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name: str, inputs, outputs, opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="packager-samples")
        m.ir_version = IR_VERSION
        onnx.checker.check_model(m, full_check=True)
        return m


def conv_bn_relu(g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int) -> str:
    w = g.weight("w", (cout, cin, k, k))
    y = g.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    bn = [g.const("gamma", g.rng.uniform(0.5, 1.5, cout).astype(np.float32)),
          g.const("beta", (g.rng.standard_normal(cout) * 0.1).astype(np.float32)),
          g.const("mean", (g.rng.standard_normal(cout) * 0.1).astype(np.float32)),
          g.const("var", g.rng.uniform(0.5, 1.5, cout).astype(np.float32))]
    y = g.op("BatchNormalization", [y, *bn], epsilon=1e-5)
    return g.op("Relu", [y])


def make_cnn(opset: int = 13) -> onnx.ModelProto:
    """A small ResNet-style CNN: conv/bn/relu, maxpool, a residual block, GAP, gemm."""
    g = GraphBuilder(seed=1)
    x = conv_bn_relu(g, "image", 3, 32, 3, 1)                        # 32x64x64
    x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])    # 32x32x32
    r = conv_bn_relu(g, x, 32, 32, 3, 1)
    r = g.op("Conv", [r, g.weight("w", (32, 32, 3, 3)), g.weight("b", (32,), 0.1)],
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    x = g.op("Relu", [g.op("Add", [x, r])])
    x = conv_bn_relu(g, x, 32, 64, 3, 2)                             # 64x16x16
    x = conv_bn_relu(g, x, 64, 64, 1, 1)
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    g.op("Gemm", [x, g.weight("fc", (10, 64)), g.weight("fcb", (10,), 0.1)], transB=1)
    g.nodes[-1].output[0] = "logits"
    return g.model("cnn",
                   [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], opset=opset)


def make_mlp(opset: int = 13) -> onnx.ModelProto:
    """Gemm/relu/softmax with a dynamic batch dimension (bound by the spec's profiles)."""
    g = GraphBuilder(seed=2)
    x = "features"
    for cin, cout in [(256, 512), (512, 256)]:
        x = g.op("Relu", [g.op("Gemm", [x, g.weight("w", (cin, cout)), g.weight("b", (cout,), 0.1)])])
    x = g.op("Gemm", [x, g.weight("w", (256, 10)), g.weight("b", (10,), 0.1)])
    g.op("Softmax", [x], axis=-1)
    g.nodes[-1].output[0] = "probs"
    return g.model("mlp",
                   [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 256])],
                   [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])], opset=opset)


def make_transformer(seq: int = 32, hidden: int = 64, heads: int = 4, ffn: int = 256,
                     opset: int = 20) -> onnx.ModelProto:
    """One post-LN transformer encoder block: attention, layernorm, gelu FFN."""
    g = GraphBuilder(seed=3)
    dh = hidden // heads
    x = "tokens"

    def proj(inp: str, cin: int, cout: int) -> str:
        return g.op("Add", [g.op("MatMul", [inp, g.weight("w", (cin, cout))]), g.weight("b", (cout,), 0.02)])

    def split_heads(t: str) -> str:
        t = g.op("Reshape", [t, g.const("shape", np.array([1, seq, heads, dh], np.int64))])
        return g.op("Transpose", [t], perm=[0, 2, 1, 3])

    q, k, v = (split_heads(proj(x, hidden, hidden)) for _ in range(3))
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.op("Div", [scores, g.const("scale", np.array(np.sqrt(dh), np.float32))])
    attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    attn = g.op("Reshape", [g.op("Transpose", [attn], perm=[0, 2, 1, 3]),
                            g.const("shape", np.array([1, seq, hidden], np.int64))])
    h = g.op("Add", [x, proj(attn, hidden, hidden)])

    def layernorm(t: str) -> str:
        return g.op("LayerNormalization",
                    [t, g.const("ln_g", g.rng.uniform(0.8, 1.2, hidden).astype(np.float32)),
                     g.const("ln_b", (g.rng.standard_normal(hidden) * 0.1).astype(np.float32))],
                    axis=-1, epsilon=1e-5)

    h = layernorm(h)
    f = g.op("Gelu", [proj(h, hidden, ffn)])
    layernorm(g.op("Add", [h, proj(f, ffn, hidden)]))
    g.nodes[-1].output[0] = "encoded"
    return g.model("transformer",
                   [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, seq, hidden])],
                   [helper.make_tensor_value_info("encoded", TensorProto.FLOAT, [1, seq, hidden])], opset=opset)


SAMPLES = {"cnn": make_cnn, "mlp": make_mlp, "transformer": make_transformer}


def write_samples(names: list[str] | None = None, root: Path = HERE) -> list[Path]:
    """Write samples/<name>/model.onnx for each requested sample; return the paths."""
    written = []
    for name in names or list(SAMPLES):
        path = root / name / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(SAMPLES[name](), str(path))
        written.append(path)
    return written


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"samples to write, of {sorted(SAMPLES)} (default: all)")
    args = ap.parse_args()
    unknown = sorted(set(args.names) - set(SAMPLES))
    if unknown:
        ap.error(f"unknown sample(s) {unknown}; choose from {sorted(SAMPLES)}")
    for p in write_samples(args.names or None):
        print(f"wrote {p.relative_to(HERE.parent)}")
