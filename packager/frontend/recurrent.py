"""LSTM, GRU and RNN over the static sequence length as a projection and a loop.

TVM's importer has no recurrent ops. With the sequence length fixed per profile, the input
projection of every time step is one MatMul over the whole sequence (X W^T + Wb); what stays
sequential (h @ R^T and the gate math of the ONNX spec, gate order LSTM i,o,f,c; GRU z,r,h) is one
`Recurrence` node per direction, which the importer compiles as one kernel with the time loop
inside (recurrent_kernel.py): forward, reverse or both directions, with initial states,
peepholes, `clip`, `input_forget`, `linear_before_reset`, `layout` and every output (Y, Y_h, Y_c).
Build time and package size do not grow with the sequence length.

Not lowered (the node stays in ONNX Runtime under partial offload, see `unsupported`):
`sequence_lens` (variable-length batches), activations outside ACTIVATIONS, weights computed at
run time.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .attrs import attr
from .recurrent_kernel import GATES, Cell, pack_r

DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "HardSigmoid", "LeakyRelu", "Elu", "Softsign", "Softplus"}
ALPHA_BETA = {"HardSigmoid": ("alpha", "beta"), "LeakyRelu": ("alpha",), "Elu": ("alpha",)}
DOMAIN, OP_TYPE = "ai.packager", "Recurrence"      # the loop node the importer compiles (relax_import)


def _activations(node) -> list[str]:
    dirs = 2 if attr(node, "direction", b"forward") == b"bidirectional" else 1
    names = [a.decode() if isinstance(a, bytes) else a for a in attr(node, "activations", [])]
    names = names or DEFAULT_ACTIVATIONS[node.op_type] * dirs
    return names * dirs if len(names) == len(DEFAULT_ACTIVATIONS[node.op_type]) else names


def unsupported(node: onnx.NodeProto) -> str | None:
    """Why this recurrent node cannot be lowered (from its attributes and inputs alone), or None."""
    if len(node.input) > 4 and node.input[4]:
        return "uses sequence_lens (variable-length sequences)"
    bad = sorted(set(_activations(node)) - ACTIVATIONS)
    if bad:
        return f"uses activation(s) {', '.join(bad)}"
    return None


class Emitter:
    """Appends nodes; `b` is the rewrites' builder (fresh names, constants), constants memoized
    (a value used twice is one initializer)."""

    def __init__(self, b, prefix: str, dtype):
        self.b, self.prefix, self.dtype, self.nodes, self.consts = b, prefix, dtype, [], {}

    def __call__(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.b.fresh(f"{self.prefix}_{op.lower()}")
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(self, hint: str, value) -> str:
        value = np.asarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self.consts:
            self.consts[key] = self.b.const(f"{self.prefix}_{hint}", value.copy(order="C"))
        return self.consts[key]

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        """Unsqueeze in the model's opset (axes: an input from 13, an attribute before)."""
        if self.b.opset >= 13:
            return self("Unsqueeze", [x, self.const("axes", np.array(axes, np.int64))])
        return self("Unsqueeze", [x], axes=axes)


def _resolved_activations(node) -> list[tuple[str, dict]]:
    """(op, attributes) per activation; alpha/beta values are consumed in order by the functions
    that take them (onnxruntime's reading of the spec)."""
    alphas, betas = list(attr(node, "activation_alpha", [])), list(attr(node, "activation_beta", []))
    out = []
    for name in _activations(node):
        attrs = {}
        keys = ALPHA_BETA.get(name, ())
        if "alpha" in keys and alphas:
            attrs["alpha"] = float(alphas.pop(0))
        if "beta" in keys and betas:
            attrs["beta"] = float(betas.pop(0))
        out.append((name, attrs))
    return out


def lower(node: onnx.NodeProto, shapes: dict, weights: dict[str, np.ndarray], b) -> list[onnx.NodeProto]:
    """The nodes that compute `node`'s outputs: per direction the input projection of the whole
    sequence and one `Recurrence` node (DOMAIN) that the importer turns into a kernel with the time
    loop inside (recurrent_kernel.py). `weights` maps initializer names to arrays (W, R, B and P
    must be among them)."""
    op, ins = node.op_type, list(node.input) + [""] * 8
    outs = list(node.output) + ["", ""]
    layout = attr(node, "layout", 0)
    seq, batch = shapes[ins[0]][:2] if layout == 0 else shapes[ins[0]][1::-1]
    W, R = weights[ins[1]], weights[ins[2]]
    dirs, hidden, G = W.shape[0], R.shape[2], GATES[op]
    bias = weights[ins[3]] if ins[3] else np.zeros((dirs, 2 * G * hidden), W.dtype)
    peep = weights[ins[7]] if op == "LSTM" and ins[7] else None
    e = Emitter(b, (node.name or op).replace("/", "_"), W.dtype)
    x = e("Transpose", [ins[0]], perm=[1, 0, 2]) if layout == 1 else ins[0]        # [seq, batch, input]
    acts, n_act = _resolved_activations(node), len(DEFAULT_ACTIVATIONS[op])
    reverse_only = attr(node, "direction", b"forward") == b"reverse"
    ys, finals = [], {"h": [], "c": []}
    for d in range(dirs):
        wb, rb = bias[d, :G * hidden], bias[d, G * hidden:]
        if op == "GRU":       # the h gate's recurrent bias is applied inside the step (after the reset)
            xb, rb_h = wb + np.concatenate([rb[:2 * hidden], np.zeros(hidden, rb.dtype)]), rb[2 * hidden:]
        else:
            xb, rb_h = wb + rb, None
        xw = e("Add", [e("MatMul", [x, e.const("W_t", W[d].T)]), e.const("Wb", xb)])   # [seq, batch, G*hidden]
        cell = Cell(op, seq, batch, hidden, tuple((name, a.get("alpha"), a.get("beta"))
                                                  for name, a in acts[d * n_act:(d + 1) * n_act]),
                    clip=attr(node, "clip"), reverse=reverse_only or d == 1,
                    linear_before_reset=bool(attr(node, "linear_before_reset", 0)),
                    input_forget=bool(attr(node, "input_forget", 0)), peepholes=peep is not None,
                    dtype=np.dtype(W.dtype).name)
        inputs = [xw, e.const("R_packed", pack_r(cell, R[d]))]
        inputs += [e.const("Rb_h", rb_h)] if rb_h is not None else []
        inputs += [e.const("P", peep[d])] if peep is not None else []
        inputs += [_initial(e, ins[5], d, layout, batch, hidden)]
        inputs += [_initial(e, ins[6], d, layout, batch, hidden)] if op == "LSTM" else []
        results = [b.fresh(f"{e.prefix}_{name}") for name, _ in cell.outputs()]
        e.nodes.append(helper.make_node(OP_TYPE, inputs, results, domain=DOMAIN, cell=cell.to_json()))
        ys.append(e.unsqueeze(results[0], [1]))                                         # [seq, 1, batch, hidden]
        finals["h"].append(e.unsqueeze(results[1], [0]))
        if op == "LSTM":
            finals["c"].append(e.unsqueeze(results[2], [0]))
    _outputs(e, ys, finals, outs, layout)
    return e.nodes


def _initial(e: Emitter, name: str, d: int, layout: int, batch: int, hidden: int) -> str:
    if not name:
        return e.const("zeros", np.zeros((batch, hidden), e.dtype))
    return e("Gather", [name, e.const("d", np.array(d, np.int64))], axis=layout)


def _outputs(e: Emitter, ys: list[str], finals: dict, outs: list[str], layout: int) -> None:
    y, y_h, y_c = outs[:3]
    if y:
        stacked = e("Concat", ys, axis=1) if len(ys) > 1 else ys[0]                    # [seq, dirs, batch, hidden]
        e("Transpose", [stacked], y, perm=[2, 0, 1, 3]) if layout == 1 else e("Identity", [stacked], y)
    for name, parts in ((y_h, finals["h"]), (y_c, finals["c"])):
        if name:
            joined = e("Concat", parts, axis=0) if len(parts) > 1 else parts[0]         # [dirs, batch, hidden]
            e("Transpose", [joined], name, perm=[1, 0, 2]) if layout == 1 else e("Identity", [joined], name)
