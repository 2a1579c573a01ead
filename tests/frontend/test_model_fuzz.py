"""Property-based fuzzing of the model checks `pack build` runs before anything is compiled
(build.check_inputs: load, checker, opset conversion, shapes bound from the spec, control flow,
operators, targets; then split_units: shape inference and the partition for ONNX Runtime).

A small valid model (Conv, Relu, Reshape, MatMul, Add) gets one to three random defects: unknown
op types and domains, impossible opsets and IR versions, negative, zero, huge or symbolic dims,
invalid element types, attributes missing or of the wrong type, inputs naming no tensor,
duplicate outputs, initializers whose data does not fit their dims, missing external data, an
empty graph, and truncated or bit-flipped files. Every outcome must be: accepted (TVM may still
refuse it later, which is not this stage's business) or a UserError of one non-empty line that
names the model or the spec file. Deterministic (derandomize=True)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from packager.build import check_inputs
from packager.errors import UserError
from packager.frontend.relax_import import import_relax
from packager.frontend.units import split_units
from packager.spec import load_spec

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
F = TensorProto.FLOAT


def base_model(batch: int | str = 1) -> onnx.ModelProto:
    """x[batch,3,8,8] -> Conv(4, 3x3, pad 1) -> Relu -> Reshape[batch,256] -> MatMul[256,10] -> Add -> y."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([-1, 256], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((256, 10)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="reshape"),
             helper.make_node("MatMul", ["f", "w2"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b2"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [batch, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", F, [batch, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


BASES = {"static": base_model(1), "dynamic": base_model("N")}
WEIRD_NAMES = ["", "nope", "x", "y", "c", "line\nbreak", "a" * 300, "\u2028", "shape"]
DIMS = [-5, -1, 0, 1, 3, 2**40, 2**62, 2**63 - 1]


def _any_value_info(m: onnx.ModelProto, data) -> onnx.ValueInfoProto | None:
    vis = list(m.graph.input) + list(m.graph.output)
    return data.draw(st.sampled_from(vis)) if vis else None


def _any_node(m: onnx.ModelProto, data) -> onnx.NodeProto | None:
    return data.draw(st.sampled_from(list(m.graph.node))) if m.graph.node else None


def mutate(m: onnx.ModelProto, kind: str, data) -> None:
    """Apply one defect of `kind` to `m` in place (a no-op where the model has nothing to break)."""
    draw = data.draw
    node, vi = _any_node(m, data), _any_value_info(m, data)
    g = m.graph
    if kind == "op_type" and node:
        node.op_type = draw(st.sampled_from(["Foo", "", "relu", "If", "Loop", "Scan", "Softmax", "TopK", "NonZero",
                                             "Gemm", "BatchNormalization", "LSTM", "Resize", "Constant"]))
    elif kind == "domain" and node:
        node.domain = draw(st.sampled_from(["com.microsoft", "ai.onnx.ml", "foo.bar", "ai.onnx", "\n"]))
    elif kind == "opset":
        version = draw(st.sampled_from([0, -1, 1, 6, 7, 9, 10, 11, 21, 22, 23, 99, 2**31, 2**62]))
        if draw(st.booleans()) and m.opset_import:
            m.opset_import[0].version = version
        elif draw(st.booleans()):
            del m.opset_import[:]
        else:
            m.opset_import.append(helper.make_opsetid(draw(st.sampled_from(["", "ai.onnx.ml", "custom"])), version))
    elif kind == "ir_version":
        m.ir_version = draw(st.sampled_from([0, -1, 1, 3, 7, 10, 11, 99, 2**40]))
    elif kind == "dim" and vi is not None:
        shape = vi.type.tensor_type.shape
        what = draw(st.sampled_from(["value", "param", "clear", "add", "drop", "no_shape"]))
        dims = shape.dim
        if what == "value" and dims:
            draw(st.sampled_from(list(dims))).dim_value = draw(st.sampled_from(DIMS))
        elif what == "param" and dims:
            draw(st.sampled_from(list(dims))).dim_param = draw(st.sampled_from(["", "?", "N", "-1", "None", "M",
                                                                                "line\nbreak", "x" * 300]))
        elif what == "clear" and dims:
            draw(st.sampled_from(list(dims))).Clear()
        elif what == "add":
            dims.add().dim_value = draw(st.sampled_from([1, 2]))
            for _ in range(draw(st.sampled_from([0, 8]))):      # rank 5 or 13
                dims.add().dim_value = 1
        elif what == "drop" and dims:
            del dims[-1]
        elif what == "no_shape":
            vi.type.tensor_type.ClearField("shape")
    elif kind == "elem_type":
        t = draw(st.sampled_from([0, 99, -1, TensorProto.STRING, TensorProto.BFLOAT16, TensorProto.INT64,
                                  TensorProto.BOOL, TensorProto.COMPLEX64, TensorProto.FLOAT8E4M3FN,
                                  TensorProto.UINT4]))
        if draw(st.booleans()) and vi is not None:
            vi.type.tensor_type.elem_type = t
        elif g.initializer:
            draw(st.sampled_from(list(g.initializer))).data_type = t
    elif kind == "not_a_tensor" and vi is not None:
        vi.type.Clear()
        vi.type.sequence_type.elem_type.tensor_type.elem_type = F
    elif kind == "attribute" and node:
        what = draw(st.sampled_from(["delete", "retype", "value", "unknown", "graph"]))
        if what == "delete" and node.attribute:
            del node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
        elif what == "retype" and node.attribute:
            a = draw(st.sampled_from(list(node.attribute)))
            name = a.name
            a.CopyFrom(draw(st.sampled_from([helper.make_attribute(name, 1.5), helper.make_attribute(name, "s"),
                                             helper.make_attribute(name, 3), helper.make_attribute(name, [1.0, 2.0]),
                                             helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)])))
        elif what == "value":
            name = draw(st.sampled_from(["kernel_shape", "pads", "strides", "dilations", "group", "axis", "perm",
                                         "allowzero", "alpha", "auto_pad"]))
            value = draw(st.sampled_from([[0, 0], [-1, -1, -1, -1], [2**62, 1], [1] * 9, [], 0, -3, 7, 2**62,
                                          "SAME_UPPER", "bogus", 1e308]))
            keep = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(keep + [helper.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS
                                                                if value == [] else None)])
        elif what == "unknown":
            node.attribute.append(helper.make_attribute("no_such_attribute", 1))
        else:
            node.attribute.append(helper.make_attribute("then_branch", helper.make_graph([], "empty", [], [])))
    elif kind == "node_input" and node:
        name = draw(st.sampled_from(WEIRD_NAMES + list(node.output)))
        if node.input and draw(st.booleans()):
            node.input[draw(st.integers(0, len(node.input) - 1))] = name
        elif draw(st.booleans()):
            node.input.append(name)
        else:
            del node.input[:]
    elif kind == "node_output" and node:
        others = [o for n in g.node for o in n.output] + [i.name for i in g.input] + [i.name for i in g.initializer]
        if node.output and draw(st.booleans()):
            node.output[0] = draw(st.sampled_from(others + WEIRD_NAMES))
        elif draw(st.booleans()):
            node.output.append(draw(st.sampled_from(others)))
        else:
            del node.output[:]
    elif kind == "initializer" and g.initializer:
        init = draw(st.sampled_from(list(g.initializer)))
        what = draw(st.sampled_from(["truncate", "extend", "dims", "rename", "duplicate", "drop", "external"]))
        if what in ("truncate", "extend"):
            try:
                raw = numpy_helper.to_array(init).tobytes()
            except Exception:  # noqa: BLE001 - an earlier defect (type, external data) already broke it
                raw = bytes(init.raw_data)
            init.ClearField("float_data")
            init.ClearField("int64_data")
            init.raw_data = raw[:draw(st.integers(0, max(len(raw) - 1, 0)))] if what == "truncate" else raw + b"\0" * 5
        elif what == "dims":
            del init.dims[:]
            init.dims.extend(draw(st.sampled_from([[], [0], [-1], [2**62, 2**62], [7], [1, 1, 1, 1, 1]])))
        elif what == "rename":
            init.name = draw(st.sampled_from(WEIRD_NAMES))
        elif what == "duplicate":
            g.initializer.append(init)
        elif what == "drop":
            g.initializer.remove(init)
        else:
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.ClearField("int64_data")
            init.data_location = TensorProto.EXTERNAL
            location = draw(st.sampled_from(["missing.bin", "../outside.bin", "/etc/hostname", "", "sub/../../x"]))
            init.external_data.extend([onnx.StringStringEntryProto(key="location", value=location),
                                       onnx.StringStringEntryProto(key="length",
                                                                   value=draw(st.sampled_from(["4", "-1", "99999"])))])
    elif kind == "graph":
        what = draw(st.sampled_from(["no_nodes", "no_outputs", "no_inputs", "reverse", "output_name", "dup_output",
                                     "input_is_init"]))
        if what == "no_nodes":
            del g.node[:]
        elif what == "no_outputs":
            del g.output[:]
        elif what == "no_inputs":
            del g.input[:]
        elif what == "reverse":
            nodes = list(g.node)[::-1]
            del g.node[:]
            g.node.extend(nodes)
        elif what == "output_name" and g.output:
            g.output[0].name = draw(st.sampled_from(WEIRD_NAMES))
        elif what == "dup_output" and g.output:
            g.output.append(g.output[0])
        elif what == "input_is_init" and g.input:
            g.input.append(helper.make_tensor_value_info("w", F, [4, 3, 3, 3]))


def mutate_deep(m: onnx.ModelProto, kind: str, data) -> None:
    """Defects the ONNX checker does not see (it checks structure, not shapes or values): they
    reach shape binding, opset conversion, shape inference and the partition."""
    draw = data.draw
    g = m.graph
    nodes = {n.name: n for n in g.node}
    if kind == "dim" and g.input and g.input[0].type.tensor_type.shape.dim:
        dims = g.input[0].type.tensor_type.shape.dim
        d = dims[draw(st.integers(0, len(dims) - 1))]
        if draw(st.booleans()):
            d.dim_value = draw(st.sampled_from(DIMS))
        else:
            d.dim_param = draw(st.sampled_from(["N", "M", "?", "", "line\nbreak"]))
    elif kind == "attribute" and {"conv", "reshape"} <= set(nodes):
        node = nodes[draw(st.sampled_from(["conv", "reshape"]))]
        name, value = draw(st.sampled_from([
            ("kernel_shape", [0, 0]), ("kernel_shape", [5, 5]), ("kernel_shape", [9, 9]), ("kernel_shape", [3]),
            ("pads", [-1] * 4), ("pads", [100] * 4), ("pads", [1, 1]), ("strides", [0, 0]), ("strides", [-1, -1]),
            ("strides", [2**62, 1]), ("dilations", [0, 0]), ("dilations", [100, 100]), ("group", 0), ("group", 2),
            ("group", -1), ("auto_pad", "SAME_UPPER"), ("auto_pad", "bogus"), ("allowzero", 1)]))
        keep = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(keep + [helper.make_attribute(name, value)])
    elif kind == "initializer":
        name = draw(st.sampled_from(["w", "b", "shape", "w2", "b2"]))
        shape = draw(st.sampled_from({
            "w": [(4, 3, 5, 5), (4, 2, 3, 3), (0, 3, 3, 3), (4, 3, 3)], "b": [(5,), (0,), ()],
            "shape": [(2,), (1,), (3,), (0,)], "w2": [(255, 10), (256, 0), (256,)], "b2": [(11,), (1,), ()]}[name]))
        if name == "shape":
            value = np.array(draw(st.sampled_from([[0, 256], [-1, -1], [1, 2**40], [2**62, -1], [], [1, 2, 128],
                                                   [-1], [256, 1]])), np.int64)
        else:
            value = np.ones(shape, np.float32)
        for init in g.initializer:
            if init.name == name:
                init.CopyFrom(numpy_helper.from_array(value, name))
    elif kind == "opset" and m.opset_import:
        newest = onnx.defs.onnx_opset_version()
        m.opset_import[0].version = draw(st.sampled_from([7, 9, 10, 13, 18, 21, 22, 23, newest]))
    elif kind == "op_swap" and {"relu", "matmul", "add"} <= set(nodes):
        node = nodes[draw(st.sampled_from(["relu", "matmul", "add"]))]
        node.op_type = draw(st.sampled_from({
            "relu": ["Sigmoid", "NonZero", "Softmax", "Cosh", "IsInf", "Mish", "Identity", "Dropout", "Shape", "Size"],
            "matmul": ["Add", "Gemm", "MatMulInteger", "Mod", "PRelu", "Expand", "Reshape"],
            "add": ["Sub", "Pow", "BitShift", "Equal", "Where", "Concat"]}[node.name]))
    elif kind == "outputs":
        name = draw(st.sampled_from(["c", "r", "x", "y", "w", "shape"]))
        g.output.append(helper.make_tensor_value_info(name, F, None))
    elif kind == "names" and g.node:
        node = draw(st.sampled_from(list(g.node)))
        node.name = draw(st.sampled_from(WEIRD_NAMES))
        if node.output and draw(st.booleans()):                # rename its output wherever it is used
            old, new = node.output[0], draw(st.sampled_from(["line\nbreak", "a" * 300, "\u2028", "x y", "r"]))
            for n in g.node:
                n.input[:] = [new if i == old else i for i in n.input]
                n.output[:] = [new if o == old else o for o in n.output]
            for o in g.output:
                if o.name == old:
                    o.name = new


DEEP_KINDS = ["dim", "attribute", "initializer", "opset", "op_swap", "outputs", "names"]
KINDS = ["op_type", "domain", "opset", "ir_version", "dim", "elem_type", "not_a_tensor", "attribute", "node_input",
         "node_output", "initializer", "graph"]


def spec_inputs(m: onnx.ModelProto) -> str:
    """The spec's `inputs:` for the (mutated) model: its own dims, symbolic ones bound to 2; so that
    most defects reach the model checks instead of stopping at a shape mismatch with the spec."""
    inits = {i.name for i in m.graph.initializer}
    out = []
    for vi in m.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type") or not vi.name.isidentifier():
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else 2
                for d in vi.type.tensor_type.shape.dim]
        out.append(f"  {vi.name}: {{shape: {dims}}}")
    return "inputs:\n" + "\n".join(out) + "\n" if out else ""


def run_front_door(folder: Path, data: bytes, inputs_yaml: str, fallback: bool, import_too: bool = False) -> str:
    """What `pack build` does before compiling; returns 'accepted' or the UserError's message.
    `import_too`: also the start of stage 3, each unit and profile imported into Relax (onnxruntime
    folding, shape inference, our rewrites, TVM's ONNX importer: fast for a model this small)."""
    (folder / "model.onnx").write_bytes(data)
    spec_path = folder / "spec.yaml"
    spec_path.write_text(f"name: fuzz\nmodel: model.onnx\ntargets: [x86-64]\n{inputs_yaml}"
                         f"onnxruntime: {{fallback: {'true' if fallback else 'false'}}}\n")
    try:
        spec = load_spec(spec_path)
        model, dtypes, _targets = check_inputs(spec, None)
        units, _split, _types = split_units(spec, model, dtypes)
        for u in units if import_too else []:
            for _pname, shapes in u.profiles:
                import_relax(u.model, shapes, u.dtypes)
    except UserError as e:
        msg = str(e)
        assert msg.strip(), "empty error message"
        assert len(msg.splitlines()) == 1 and "\n" not in msg and "\r" not in msg, msg
        # the model (a part of it is "model.onnx [part p0]") or the spec, by path
        assert "model.onnx" in msg or str(folder) in msg, f"the error names neither the model nor the spec: {msg}"
        return msg
    return "accepted"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("modelfuzz")


@pytest.mark.parametrize("name", sorted(BASES))
def test_the_bases_are_accepted(folder, name):
    """The mutations start from models that pass (else every mutation is trivially an error)."""
    m = BASES[name]
    for fallback in (True, False):
        assert run_front_door(folder, m.SerializeToString(), spec_inputs(m), fallback) == "accepted"


@FUZZ
@given(base=st.sampled_from(sorted(BASES)), kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
       fallback=st.booleans(), data=st.data())
def test_mutated_models(folder, base, kinds, fallback, data):
    m = onnx.ModelProto()
    m.CopyFrom(BASES[base])
    for kind in kinds:
        mutate(m, kind, data)
    run_front_door(folder, m.SerializeToString(), spec_inputs(m), fallback)


@FUZZ
@given(base=st.sampled_from(sorted(BASES)), kinds=st.lists(st.sampled_from(DEEP_KINDS), min_size=1, max_size=3),
       fallback=st.booleans(), data=st.data())
def test_mutations_the_checker_passes(folder, base, kinds, fallback, data):
    m = onnx.ModelProto()
    m.CopyFrom(BASES[base])
    for kind in kinds:
        mutate_deep(m, kind, data)
    run_front_door(folder, m.SerializeToString(), spec_inputs(m), fallback, import_too=True)


@FUZZ
@given(base=st.sampled_from(sorted(BASES)), cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1),
       st.integers(0, 255)), max_size=4), fallback=st.booleans())
@example(base="static", cut=0.0, flips=[], fallback=True)                    # an empty file
def test_damaged_files(folder, base, cut, flips, fallback):
    """The serialized model truncated and/or with bytes overwritten."""
    m = BASES[base]
    data = bytearray(m.SerializeToString())
    for where, byte in flips:
        data[min(int(where * len(data)), len(data) - 1)] = byte
    if cut < 1:
        data = data[:math.floor(cut * len(data))]
    run_front_door(folder, bytes(data), spec_inputs(m), fallback)


def _input_elem_type_99(m: onnx.ModelProto) -> None:
    m.graph.input[0].type.tensor_type.elem_type = 99


def _ragged_raw_data(m: onnx.ModelProto) -> None:
    b = m.graph.initializer[1]                                   # b: 4 floats; the checker catches too few bytes
    b.raw_data = numpy_helper.to_array(b).tobytes() + b"\0" * 5


def _initializer_type_99(m: onnx.ModelProto) -> None:
    m.graph.initializer[1].data_type = 99


def _rank_13_input(m: onnx.ModelProto) -> None:
    for _ in range(9):
        m.graph.input[0].type.tensor_type.shape.dim.add().dim_value = 1


def _huge_input_needs_conversion(m: onnx.ModelProto) -> None:
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**40
    m.opset_import[0].version = 9                                # converted, then checked on random inputs


def _input_beyond_int64(m: onnx.ModelProto) -> None:
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**62


def _newline_in_names(m: onnx.ModelProto) -> None:
    m.graph.node[1].op_type = "Cosh"                              # unsupported: the error lists the node
    m.graph.node[1].name = "re\nlu"


@pytest.mark.parametrize("defect,needle", [
    (_input_elem_type_99, "graph input/output 'x' has element type 99, which is not supported"),   # ValueError
    (_ragged_raw_data, "initializer 'b' does not decode"),                   # ValueError in TVM's importer
    (_initializer_type_99, "initializer 'b' has element type 99"),           # "TVM's ONNX importer failed: 99"
    (_rank_13_input, "has rank 13; packages hold tensors of rank 8 at most"),   # runtime refuses the plan
    (_huge_input_needs_conversion, "needs at least 768.00 TiB"),             # MemoryError, later a size estimate
    (_input_beyond_int64, "would take more than 2^63 bytes"),                # ValueError: array is too big
    (_newline_in_names, "re\\nlu"),                                          # a second line
], ids=lambda v: getattr(v, "__name__", "")[1:])
def test_fuzz_findings(folder, defect, needle):
    """Defects the fuzz tests found escaping as tracebacks or unclear errors: now one clear line."""
    m = onnx.ModelProto()
    m.CopyFrom(BASES["static"])
    defect(m)
    msg = run_front_door(folder, m.SerializeToString(), spec_inputs(m), fallback=False, import_too=True)
    assert needle in msg, msg
