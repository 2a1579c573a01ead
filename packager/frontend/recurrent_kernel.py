"""One direction of an LSTM, GRU or RNN as one kernel with the time loop inside.

The input projection of every step is one MatMul over the whole sequence, outside this kernel
(recurrent.py). What stays sequential is, per step, the product of the previous hidden state with
R^T and the gate math of the ONNX operator spec (gate order LSTM i,o,f,c; GRU z,r,h); compiling
it once and running it T times keeps the build and the package independent of the sequence
length (an unrolled graph grows with it: two GRUs over 200 frames made thousands of kernels).

`kernel(cell)` is the plain form: serial loops, what the kernel means. Loop primitives cannot
restructure a loop that carries state, so a scheduler regenerates the kernel instead: with `Loops`
(vector lanes, a parallel matrix-vector product) on a CPU, or with its own thread structure from
`step_math` on a GPU (optimize/schedule/rules/recurrence.py); the untimed-kernel check compares
the result with the plain form.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from tvm import tirx
from tvm.script import tirx as T

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
ATTR = "packager.recurrence"          # PrimFunc attribute: the Cell as JSON (how schedulers know it)
CHUNK = 16                            # gate columns per contiguous block of the packed R
GROUP = 4                             # chunks a CPU thread accumulates at once (independent FMA chains)


@dataclass(frozen=True)
class Cell:
    """What one direction of a recurrent layer computes, in the kernel's terms. `acts` are
    (name, alpha, beta) for the spec's f, g (and h) activations."""

    op: str
    steps: int
    batch: int
    hidden: int
    acts: tuple[tuple[str, float | None, float | None], ...]
    clip: float | None = None
    reverse: bool = False
    linear_before_reset: bool = False
    input_forget: bool = False
    peepholes: bool = False
    dtype: str = "float32"

    @property
    def gates(self) -> int:
        return GATES[self.op]

    @property
    def padded(self) -> int:
        """Each gate's columns in the packed R and in the step's products: the hidden size
        rounded up to whole chunks (gate q, unit i is column q * padded + i)."""
        return -(-self.hidden // CHUNK) * CHUNK

    @property
    def chunks(self) -> int:
        return self.gates * self.padded // CHUNK

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Cell":
        raw = json.loads(text)
        return cls(**{**raw, "acts": tuple(tuple(a) for a in raw["acts"])})

    def inputs(self) -> list[tuple[str, tuple[int, ...]]]:
        """The kernel's inputs in order: projected inputs [T, B, G*H], R packed (pack_r), the
        GRU's recurrent h-gate bias [H], LSTM peepholes [3H], initial h (and c) [B, H]."""
        t, b, h = self.steps, self.batch, self.hidden
        out = [("xw", (t, b, self.gates * h)), ("r_p", (self.chunks, h, CHUNK))]
        out += [("rb_h", (h,))] if self.op == "GRU" else []
        out += [("p", (3 * h,))] if self.peepholes else []
        out += [("h0", (b, h))] + ([("c0", (b, h))] if self.op == "LSTM" else [])
        return out

    def outputs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Y [T, B, H] (in time order, also when run in reverse), the last h (and c) [B, H]."""
        b, h = self.batch, self.hidden
        return [("y", (self.steps, b, h)), ("h_last", (b, h))] + ([("c_last", (b, h))] if self.op == "LSTM" else [])


def pack_r(cell: Cell, r: np.ndarray) -> np.ndarray:
    """ONNX's R of one direction [G*H, H] as the kernel reads it: R^T's columns (gate q's unit i
    at q * padded + i, zeros in the padding) in blocks of CHUNK columns, each block [H, CHUNK]
    contiguous, so a step streams every block front to back."""
    g, h, hp = cell.gates, cell.hidden, cell.padded
    cols = np.zeros((h, g, hp), r.dtype)
    cols[:, :, :h] = r.T.reshape(h, g, h)
    return np.ascontiguousarray(cols.reshape(h, cell.chunks, CHUNK).transpose(1, 0, 2))


@dataclass(frozen=True)
class Loops:
    """How the kernel's loops run: the gate math in `lanes` vector lanes over hidden units (they
    must divide the hidden size; the matrix-vector product always runs CHUNK-wide vectors), its
    GROUPs of chunks `parallel` across threads."""

    lanes: int = 1
    parallel: bool = False


def _activation(name: str, alpha: float | None, beta: float | None, dt: str):
    """The ONNX activation `name` as a function of a TIR expression of type `dt` (defaults of
    the spec)."""
    def fn(x):
        one, zero = tirx.const(1, dt), tirx.const(0, dt)
        if name == "Sigmoid":
            return tirx.sigmoid(x)
        if name == "Tanh":
            return tirx.tanh(x)
        if name == "Relu":
            return tirx.max(x, zero)
        if name == "HardSigmoid":
            a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
            return tirx.max(zero, tirx.min(one, tirx.const(a, dt) * x + tirx.const(b, dt)))
        if name == "LeakyRelu":
            return tirx.Select(x < zero, tirx.const(0.01 if alpha is None else alpha, dt) * x, x)
        if name == "Elu":
            a = tirx.const(1.0 if alpha is None else alpha, dt)
            return tirx.Select(x < zero, a * (tirx.exp(x) - one), x)
        if name == "Softsign":
            return x / (one + tirx.abs(x))
        if name == "Softplus":
            return tirx.log(one + tirx.exp(x))
        raise ValueError(f"activation {name} has no kernel form")
    return fn


def _gate(cell: Cell, act):
    """Clip (if the node has `clip`), then the activation: what every gate applies."""
    if cell.clip is None:
        return act
    hi, lo = tirx.const(cell.clip, cell.dtype), tirx.const(-cell.clip, cell.dtype)
    return lambda x: act(tirx.max(tirx.min(x, hi), lo))


def kernel(cell: Cell, loops: Loops = Loops()) -> tirx.PrimFunc:
    """The kernel for `cell` with `loops`' structure, tagged with the cell (ATTR)."""
    return tagged(_loop_kernel(cell, loops), cell)


def tagged(func: tirx.PrimFunc, cell: Cell) -> tirx.PrimFunc:
    """`func` marked as `cell`'s kernel (ATTR), its buffers not aliased."""
    return func.with_attr(ATTR, cell.to_json()).with_attr("tirx.noalias", True)


def step_math(cell: Cell):
    """The per-element gate math as functions of TIR expressions, for every form of the kernel:
    (gate f, gate g, activation h)."""
    acts = [_activation(*a, cell.dtype) for a in cell.acts]
    return _gate(cell, acts[0]), _gate(cell, acts[1]) if len(acts) > 1 else None, acts[2] if len(acts) > 2 else None


def _loop_kernel(cell: Cell, loops: Loops) -> tirx.PrimFunc:
    """Serial time loop; per step the matrix-vector product h @ R^T over the packed R, GROUP
    chunks of accumulators at a time (in parallel when asked), then the gate math over hidden
    units in `lanes` vectors. No value is let-bound inside a vectorized loop (TVM 0.27's
    vectorizer computes such a value for one lane only): each gate goes through a `lanes`-wide
    local buffer."""
    steps, batch, hid, hp, dt = cell.steps, cell.batch, cell.hidden, cell.padded, cell.dtype
    vec = loops.lanes
    if hid % vec:
        raise ValueError(f"{vec} lanes do not divide the hidden size {hid}")
    f, g, h_act = step_math(cell)
    op, lbr, peep = cell.op, cell.linear_before_reset, cell.peepholes
    per_gate = hp // CHUNK
    grp = next(n for n in (GROUP, 2, 1) if per_gate % n == 0)
    first = (2 if op == "GRU" and not lbr else cell.gates) * per_gate   # the GRU without linear_before_reset: r first
    one, zero = tirx.const(1, dt), tirx.const(0, dt)

    def tt(s):                                              # the time index of step s
        return steps - 1 - s if cell.reverse else s

    @T.macro
    def matvec(acc, src, r_p, chunk0, nchunks):
        for b in range(batch):
            for jg in T.parallel(nchunks // grp) if loops.parallel else T.serial(nchunks // grp):
                reg = T.alloc_buffer((grp, CHUNK), dt, scope="local")
                for jc in T.unroll(grp) if vec > 1 else T.serial(grp):
                    for ji in T.vectorized(CHUNK) if vec > 1 else T.serial(CHUNK):
                        reg[jc, ji] = zero
                for k in range(hid):
                    for jc in T.unroll(grp) if vec > 1 else T.serial(grp):
                        for ji in T.vectorized(CHUNK) if vec > 1 else T.serial(CHUNK):
                            reg[jc, ji] = reg[jc, ji] + src[b, k] * r_p[chunk0 + jg * grp + jc, k, ji]
                for jc in T.unroll(grp) if vec > 1 else T.serial(grp):
                    for ji in T.vectorized(CHUNK) if vec > 1 else T.serial(CHUNK):
                        acc[b, (chunk0 + jg * grp + jc) * CHUNK + ji] = reg[jc, ji]

    @T.prim_func(private=True)
    def func(xw: T.Buffer((steps, batch, cell.gates * hid), dt), r_p: T.Buffer((cell.chunks, hid, CHUNK), dt),
             rb_h: T.Buffer((hid,), dt), p: T.Buffer((3 * hid,), dt), h0: T.Buffer((batch, hid), dt),
             c0: T.Buffer((batch, hid), dt), y: T.Buffer((steps, batch, hid), dt),
             h_last: T.Buffer((batch, hid), dt), c_last: T.Buffer((batch, hid), dt)):
        h = T.alloc_buffer((batch, hid), dt)
        c = T.alloc_buffer((batch, hid), dt)
        rh = T.alloc_buffer((batch, hid), dt)
        acc = T.alloc_buffer((batch, cell.gates * hp), dt)
        for b, i in T.grid(batch, hid):
            h[b, i] = h0[b, i]
            if op == "LSTM":
                c[b, i] = c0[b, i]
        for s in range(steps):
            matvec(acc, h, r_p, 0, first)
            if op == "GRU" and not lbr:                     # n = g(x_h + (r * h) @ R_h^T + Rb_h)
                for b, io in T.grid(batch, hid // vec):
                    for ii in T.vectorized(vec):
                        rh[b, io * vec + ii] = f(xw[tt(s), b, hid + io * vec + ii]
                                                 + acc[b, hp + io * vec + ii]) * h[b, io * vec + ii]
                matvec(acc, rh, r_p, 2 * per_gate, per_gate)
            for b, io in T.grid(batch, hid // vec):
                g1 = T.alloc_buffer((vec,), dt, scope="local")
                g2 = T.alloc_buffer((vec,), dt, scope="local")
                if op == "GRU":                             # g1 = z, g2 = n
                    for ii in T.vectorized(vec):
                        g1[ii] = f(xw[tt(s), b, io * vec + ii] + acc[b, io * vec + ii])
                    for ii in T.vectorized(vec):
                        g2[ii] = g(xw[tt(s), b, 2 * hid + io * vec + ii]
                                   + f(xw[tt(s), b, hid + io * vec + ii] + acc[b, hp + io * vec + ii])
                                   * (acc[b, 2 * hp + io * vec + ii] + rb_h[io * vec + ii])) if lbr else \
                            g(xw[tt(s), b, 2 * hid + io * vec + ii] + acc[b, 2 * hp + io * vec + ii]
                              + rb_h[io * vec + ii])
                    for ii in T.vectorized(vec):
                        h[b, io * vec + ii] = (one - g1[ii]) * g2[ii] + g1[ii] * h[b, io * vec + ii]
                elif op == "LSTM":                          # g1 = i, g2 = f, then c and h in place
                    for ii in T.vectorized(vec):
                        g1[ii] = f(xw[tt(s), b, io * vec + ii] + acc[b, io * vec + ii]
                                   + (p[io * vec + ii] * c[b, io * vec + ii] if peep else zero))
                    for ii in T.vectorized(vec):
                        g2[ii] = one - g1[ii] if cell.input_forget else \
                            f(xw[tt(s), b, 2 * hid + io * vec + ii] + acc[b, 2 * hp + io * vec + ii]
                              + (p[2 * hid + io * vec + ii] * c[b, io * vec + ii] if peep else zero))
                    for ii in T.vectorized(vec):
                        c[b, io * vec + ii] = g2[ii] * c[b, io * vec + ii] + g1[ii] * g(
                            xw[tt(s), b, 3 * hid + io * vec + ii] + acc[b, 3 * hp + io * vec + ii])
                    for ii in T.vectorized(vec):
                        h[b, io * vec + ii] = f(xw[tt(s), b, hid + io * vec + ii] + acc[b, hp + io * vec + ii]
                                                + (p[hid + io * vec + ii] * c[b, io * vec + ii] if peep else zero)) \
                            * h_act(c[b, io * vec + ii])
                else:
                    for ii in T.vectorized(vec):
                        h[b, io * vec + ii] = f(xw[tt(s), b, io * vec + ii] + acc[b, io * vec + ii])
                for ii in T.vectorized(vec):
                    y[tt(s), b, io * vec + ii] = h[b, io * vec + ii]
        for b, i in T.grid(batch, hid):
            h_last[b, i] = h[b, i]
            if op == "LSTM":
                c_last[b, i] = c[b, i]

    return only_params(func, cell)


def only_params(func: tirx.PrimFunc, cell: Cell) -> tirx.PrimFunc:
    """`func` with the parameters `cell`'s kernel has (Cell.inputs, then outputs), by name: the
    forms are written with every parameter any cell uses."""
    names = {n for n, _ in cell.inputs() + cell.outputs()}
    params = [v for v in func.params if v.name in names]
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def lanes_for(cell: Cell, lanes: int) -> int:
    """The widest vector (at most `lanes`, a power of two) that divides the hidden size."""
    while lanes > 1 and (cell.hidden % lanes):
        lanes //= 2
    return lanes


