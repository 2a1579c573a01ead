"""LSTM, GRU and RNN unrolled into primitive ONNX ops over the static sequence length.

TVM's importer has no recurrent ops. With the sequence length fixed per profile, a recurrent
layer is a chain of small matmuls and element-wise gates, which the packager compiles (and fuses)
like any other graph: the input projection of every time step is one MatMul over the whole
sequence (X W^T + Wb), then per step one MatMul with R^T and the gate math of the ONNX spec
(gate order LSTM i,o,f,c; GRU z,r,h), forward, reverse or both directions, with initial states,
peepholes, `clip`, `input_forget`, `linear_before_reset`, `layout` and every output (Y, Y_h, Y_c).

Not unrolled (the node stays in ONNX Runtime under partial offload, see `unsupported`):
`sequence_lens` (variable-length batches), activations outside ACTIVATIONS, weights computed at
run time, sequences longer than MAX_STEPS (the unrolled graph would be larger than worth it).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .attrs import attr

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "HardSigmoid", "LeakyRelu", "Elu", "Softsign", "Softplus"}
ALPHA_BETA = {"HardSigmoid": ("alpha", "beta"), "LeakyRelu": ("alpha",), "Elu": ("alpha",)}
MAX_STEPS = 512


def _activations(node) -> list[str]:
    dirs = 2 if attr(node, "direction", b"forward") == b"bidirectional" else 1
    names = [a.decode() if isinstance(a, bytes) else a for a in attr(node, "activations", [])]
    names = names or DEFAULT_ACTIVATIONS[node.op_type] * dirs
    return names * dirs if len(names) == len(DEFAULT_ACTIVATIONS[node.op_type]) else names


def unsupported(node: onnx.NodeProto) -> str | None:
    """Why this recurrent node cannot be unrolled (from its attributes and inputs alone), or None."""
    if len(node.input) > 4 and node.input[4]:
        return "uses sequence_lens (variable-length sequences)"
    bad = sorted(set(_activations(node)) - ACTIVATIONS)
    if bad:
        return f"uses activation(s) {', '.join(bad)}"
    return None


class Emitter:
    """Appends nodes; `b` is the rewrites' builder (fresh names, constants), constants memoized so
    a step loop does not add one initializer per step."""

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

    def scalar(self, v: float) -> str:
        return self.const("c", np.array(v, self.dtype))

    def act(self, fn: tuple[str, dict], x: str) -> str:
        return self(fn[0], [x], **fn[1])

    def clip(self, node, x: str) -> str:
        c = attr(node, "clip")
        return x if c is None else self("Clip", [x, self.scalar(-c), self.scalar(c)])


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


def unroll(node: onnx.NodeProto, shapes: dict, weights: dict[str, np.ndarray], b) -> list[onnx.NodeProto]:
    """The nodes that compute `node`'s outputs step by step. `weights` maps initializer names to
    arrays (W, R, B and P must be among them)."""
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
        state = {"h": _initial(e, ins[5], d, layout, batch, hidden)}
        if op == "LSTM":
            state["c"] = _initial(e, ins[6], d, layout, batch, hidden)
        wb, rb = bias[d, :G * hidden], bias[d, G * hidden:]
        if op == "GRU":       # the h gate's recurrent bias is applied inside the step (after the reset)
            rb = np.concatenate([rb[:2 * hidden], np.zeros(hidden, rb.dtype)]), rb[2 * hidden:]
        xw = e("Add", [e("MatMul", [x, e.const("W_t", W[d].T)]), e.const("Wb", wb + (rb[0] if op == "GRU" else rb))])
        cell = Cell(e, node, hidden, acts[d * n_act:(d + 1) * n_act], R[d],
                    rb[1] if op == "GRU" else None, peep[d] if peep is not None else None)
        step = {"LSTM": cell.lstm, "GRU": cell.gru, "RNN": cell.rnn}[op]
        hs = {}
        for t in (range(seq - 1, -1, -1) if reverse_only or d == 1 else range(seq)):
            state = step(e("Gather", [xw, e.const("t", np.array(t, np.int64))], axis=0), state)   # [batch, G*hidden]
            hs[t] = state["h"]
        ys.append(e("Concat", [e.unsqueeze(hs[t], [0, 1]) for t in range(seq)], axis=0))  # [seq, 1, batch, hidden]
        for k in state:
            finals[k].append(e.unsqueeze(state[k], [0]))
    _outputs(e, ys, finals, outs, layout)
    return e.nodes


def _initial(e: Emitter, name: str, d: int, layout: int, batch: int, hidden: int) -> str:
    if not name:
        return e.const("zeros", np.zeros((batch, hidden), e.dtype))
    return e("Gather", [name, e.const("d", np.array(d, np.int64))], axis=layout)


class Cell:
    """One direction's step functions (ONNX operator spec formulas); state = {"h": H, "c": C}."""

    def __init__(self, e: Emitter, node, hidden: int, acts, r: np.ndarray, rbh, peep):
        self.e, self.node, self.hidden, self.acts = e, node, hidden, acts
        self.r_t = e.const("R_t", r.T)
        if node.op_type == "GRU":
            self.r_zr_t, self.r_h_t, self.rbh = e.const("Rzr_t", r[:2 * hidden].T), e.const("Rh_t", r[2 * hidden:].T), \
                e.const("Rbh", rbh)
        self.peep = [e.const("P", peep[k * hidden:(k + 1) * hidden]) for k in range(3)] if peep is not None else None

    def _split(self, x: str, pieces: int) -> list[str]:
        outs = [self.e.b.fresh(f"{self.e.prefix}_gate") for _ in range(pieces)]
        sizes = [self.hidden] * pieces
        if self.e.b.opset >= 13:
            self.e.nodes.append(helper.make_node("Split", [x, self.e.const("split", np.array(sizes, np.int64))], outs,
                                                 axis=1))
        else:                                       # opset 11-12: sizes are an attribute
            self.e.nodes.append(helper.make_node("Split", [x], outs, axis=1, split=sizes))
        return outs

    def _gate(self, fn, pre: str) -> str:
        return self.e.act(fn, self.e.clip(self.node, pre))

    def lstm(self, xt: str, state: dict) -> dict:
        e, (f_act, g_act, h_act) = self.e, self.acts
        i, o, f, c = self._split(e("Add", [xt, e("MatMul", [state["h"], self.r_t])]), 4)
        if self.peep:
            pi, po, pf = self.peep
            i, f = e("Add", [i, e("Mul", [pi, state["c"]])]), e("Add", [f, e("Mul", [pf, state["c"]])])
        i = self._gate(f_act, i)
        f = e("Sub", [e.scalar(1), i]) if attr(self.node, "input_forget", 0) else self._gate(f_act, f)
        c_new = e("Add", [e("Mul", [f, state["c"]]), e("Mul", [i, self._gate(g_act, c)])])
        if self.peep:
            o = e("Add", [o, e("Mul", [self.peep[1], c_new])])
        return {"h": e("Mul", [self._gate(f_act, o), e.act(h_act, c_new)]), "c": c_new}

    def gru(self, xt: str, state: dict) -> dict:
        e, (f_act, g_act), h = self.e, self.acts, state["h"]
        xz, xr, xh = self._split(xt, 3)
        hz, hr = self._split(e("MatMul", [h, self.r_zr_t]), 2)
        z, r = self._gate(f_act, e("Add", [xz, hz])), self._gate(f_act, e("Add", [xr, hr]))
        if attr(self.node, "linear_before_reset", 0):
            rh = e("Mul", [r, e("Add", [e("MatMul", [h, self.r_h_t]), self.rbh])])
        else:
            rh = e("Add", [e("MatMul", [e("Mul", [r, h]), self.r_h_t]), self.rbh])
        h_tilde = self._gate(g_act, e("Add", [xh, rh]))
        return {"h": e("Add", [e("Mul", [e("Sub", [e.scalar(1), z]), h_tilde]), e("Mul", [z, h])])}

    def rnn(self, xt: str, state: dict) -> dict:
        return {"h": self._gate(self.acts[0], self.e("Add", [xt, self.e("MatMul", [state["h"], self.r_t])]))}


def _outputs(e: Emitter, ys: list[str], finals: dict, outs: list[str], layout: int) -> None:
    y, y_h, y_c = outs[:3]
    if y:
        stacked = e("Concat", ys, axis=1) if len(ys) > 1 else ys[0]                    # [seq, dirs, batch, hidden]
        e("Transpose", [stacked], y, perm=[2, 0, 1, 3]) if layout == 1 else e("Identity", [stacked], y)
    for name, parts in ((y_h, finals["h"]), (y_c, finals["c"])):
        if name:
            joined = e("Concat", parts, axis=0) if len(parts) > 1 else parts[0]         # [dirs, batch, hidden]
            e("Transpose", [joined], name, perm=[1, 0, 2]) if layout == 1 else e("Identity", [joined], name)
