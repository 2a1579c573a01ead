"""Data movement on 8-bit values (optimize/qdq_moves.py, in the int8 pass): a QDQ channel
shuffle (concat, reshape, transpose, reshape, split, each bracketed by QuantizeLinear ->
DequantizeLinear with one scale) and a max pool run on the 8-bit tensors, the round trips go, and
the module computes exactly what it did; a move between different parameters keeps its round
trip."""
from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper
from tvm import relax

from packager.frontend import import_relax, load_model
from packager.optimize.constfold import fold_constants
from packager.optimize.int8 import integer_kernels
from packager.optimize.relax_util import legalize
from packager.optimize.schedule.rules.int_dot import PAIR
from support.helpers import save_model
from test_int8 import _dq_pair

F = TensorProto.FLOAT


def _shuffle_model(second_scale: float) -> onnx.ModelProto:
    nodes, inits = [], []
    a = _dq_pair(nodes, inits, "a", "a", 0.05, 128)
    b = _dq_pair(nodes, inits, "b", "b", 0.05, 128)
    nodes.append(helper.make_node("Concat", [a, b], ["cat"], axis=1))
    c = _dq_pair(nodes, inits, "c", "cat", 0.05, 128)
    inits += [onnx.numpy_helper.from_array(np.array(s, np.int64), n) for n, s in
              (("s5", [1, 2, 4, 6, 6]), ("s4", [1, 8, 6, 6]), ("halves", [4, 4]))]
    nodes.append(helper.make_node("Reshape", [c, "s5"], ["r"]))
    r = _dq_pair(nodes, inits, "r", "r", 0.05, 128)
    nodes.append(helper.make_node("Transpose", [r], ["t"], perm=[0, 2, 1, 3, 4]))
    t = _dq_pair(nodes, inits, "t", "t", 0.05, 128)
    nodes.append(helper.make_node("Reshape", [t, "s4"], ["u"]))
    u = _dq_pair(nodes, inits, "u", "u", 0.05, 128)
    nodes.append(helper.make_node("Split", [u, "halves"], ["p", "q"], axis=1))
    p = _dq_pair(nodes, inits, "p", "p", 0.05, 128)
    q = _dq_pair(nodes, inits, "q", "q", second_scale, 128)
    nodes.append(helper.make_node("MaxPool", [p], ["m"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]))
    m = _dq_pair(nodes, inits, "m", "m", 0.05, 128)
    nodes += [helper.make_node("Identity", [m], ["pooled"]), helper.make_node("Identity", [q], ["other"])]
    g = helper.make_graph(nodes, "shuffle", [helper.make_tensor_value_info(n, F, [1, 4, 6, 6]) for n in "ab"],
                          [helper.make_tensor_value_info("pooled", F, [1, 4, 3, 3]),
                           helper.make_tensor_value_info("other", F, [1, 4, 6, 6])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _run(mod: tvm.IRModule, *xs: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(legalize(fold_constants(mod)[0]), target="llvm"), tvm.cpu())
    return [o.numpy() for o in vm["main"](*(tvm.runtime.tensor(x) for x in xs))]


def _ops(mod: tvm.IRModule) -> dict[str, list[str]]:
    """Relax op -> the dtypes of its first operand."""
    out: dict[str, list[str]] = {}

    def visit(e) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.args and hasattr(e.args[0], "ty"):
            first = e.args[0].ty
            out.setdefault(e.op.name, []).append(str(getattr(first, "dtype", "tuple")))

    relax.analysis.post_order_visit(mod["main"], visit)
    return out


def test_a_qdq_channel_shuffle_and_max_pool_move_8bit_values_exactly(tmp_path):
    mod = import_relax(load_model(save_model(_shuffle_model(0.05), tmp_path / "s.onnx")),
                       {"a": (1, 4, 6, 6), "b": (1, 4, 6, 6)}, {"a": "float32", "b": "float32"})[0]
    out, report = integer_kernels(mod, (PAIR,))
    assert report.details["round_trips"] == 7 and report.details["moves"] == 6   # concat .. split, max pool
    assert "6 data movement op(s) on 8-bit values" in report.summary
    ops = _ops(out)
    assert ops["relax.quantize"] == ["float32", "float32"]                      # the inputs' own only
    assert set(ops["relax.permute_dims"]) == {"uint8"} and set(ops["relax.nn.max_pool2d"]) == {"uint8"}
    rng = np.random.default_rng(0)
    xs = [rng.normal(0, 3, (1, 4, 6, 6)).astype(np.float32) for _ in range(2)]
    for want, got in zip(_run(mod, *xs), _run(out, *xs)):
        assert np.array_equal(want, got)


def test_a_move_between_different_scales_keeps_its_round_trip(tmp_path):
    mod = import_relax(load_model(save_model(_shuffle_model(0.07), tmp_path / "s.onnx")),
                       {"a": (1, 4, 6, 6), "b": (1, 4, 6, 6)}, {"a": "float32", "b": "float32"})[0]
    out, report = integer_kernels(mod, (PAIR,))
    assert report.details["round_trips"] == 6                                   # all but q's (scale 0.07)
    assert _ops(out)["relax.quantize"].count("float32") == 3
    rng = np.random.default_rng(1)
    xs = [rng.normal(0, 3, (1, 4, 6, 6)).astype(np.float32) for _ in range(2)]
    for want, got in zip(_run(mod, *xs), _run(out, *xs)):
        assert np.array_equal(want, got)
