"""Recurrent loop kernels (frontend/recurrent_kernel.py): the time loop carries the state, so loop
primitives cannot restructure them; each device regenerates the kernel from its cell instead.

* CPU: the per-step matrix-vector product h @ R^T over the packed R in CHUNK-wide vectors, in
  parallel over groups of chunks when one step has enough work to pay a parallel launch; the
  gate math in vector lanes over hidden units.
* GPU: one thread block per batch row; the state and the step's gate pre-activations live in
  shared memory, threads take gate columns (then hidden units) in strides, and the block meets
  at a barrier after each phase of a step.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ....frontend.recurrent_kernel import (ATTR, CHUNK, Cell, Loops, kernel, lanes_for, only_params, step_math,
                                           tagged)
from ..tir_util import PARALLEL_MIN_WORK, KernelSchedule

GPU_MAX_THREADS = 1024


def cell_of(func: tirx.PrimFunc) -> Cell | None:
    """The recurrent cell `func` computes, or None for any other kernel."""
    text = func.attrs.get(ATTR) if func.attrs is not None else None
    return Cell.from_json(str(text)) if text is not None else None


def _keep_attrs(new: tirx.PrimFunc, old: tirx.PrimFunc) -> tirx.PrimFunc:
    return new.with_attrs(dict(old.attrs))


def cpu(func: tirx.PrimFunc, lanes: int) -> tuple[tirx.PrimFunc, KernelSchedule] | None:
    """The CPU form of a recurrent kernel with at most `lanes` vector lanes (None: not one)."""
    cell = cell_of(func)
    if cell is None:
        return None
    vec = lanes_for(cell, lanes)
    parallel = cell.chunks > 1 and cell.batch * cell.gates * cell.hidden * cell.hidden >= PARALLEL_MIN_WORK
    out = kernel(cell, Loops(vec, parallel))
    return _keep_attrs(out, func), KernelSchedule("recurrence", parallel=cell.chunks if parallel else 1,
                                                  vector=vec)


def gpu(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """The GPU form of a recurrent kernel (None: not one)."""
    cell = cell_of(func)
    if cell is None:
        return None
    return _keep_attrs(tagged(_gpu_kernel(cell), cell), func).with_attr("tirx.is_scheduled", True)


def _gpu_kernel(cell: Cell) -> tirx.PrimFunc:
    """Phases per step, a barrier after each: h @ R^T into `acc` (threads over gate columns),
    the gate math into `h_next` (threads over hidden units; an LSTM's c stays in the thread's own
    registers, as each thread keeps its units), then `h_next` copied to `h`. Shared buffers are
    padded to whole rounds of threads and global reads clamped, so only the global writes sit
    under a bounds check (TVM's sync planner cannot place a barrier inside a condition)."""
    steps, batch, hid, dt, rev, op = cell.steps, cell.batch, cell.hidden, cell.dtype, cell.reverse, cell.op
    hp = cell.padded                             # a gate's columns in the packed R and in `acc`
    gh = cell.gates * hp
    lbr = cell.linear_before_reset
    cols = 2 * hp if op == "GRU" and not lbr else gh
    nt = min(GPU_MAX_THREADS, -(-gh // 32) * 32)
    per = -(-hid // nt)                          # hidden units per thread
    rounds = -(-gh // nt)                        # gate columns per thread
    f, g, h_act = step_math(cell)
    one, zero = tirx.const(1, dt), tirx.const(0, dt)
    peep = cell.peepholes
    lstm, gru = op == "LSTM", op == "GRU"

    def tt(s):
        return steps - 1 - s if rev else s

    def unit(io, tx):                            # a thread's io-th hidden unit, clamped for reads
        return tirx.min(io * nt + tx, hid - 1)

    def column(col0, jo, tx, ncols):
        return col0 + tirx.min(jo * nt + tx, ncols - 1)

    @T.macro
    def matvec(acc, src, r_p, tx, col0, ncols):
        for jo in range(-(-ncols // nt)):
            reg = T.alloc_buffer((1,), dt, scope="local")
            reg[0] = zero
            for k in range(hid):
                reg[0] = reg[0] + src[k] * r_p[column(col0, jo, tx, ncols) // CHUNK, k,
                                               column(col0, jo, tx, ncols) % CHUNK]
            acc[col0 + jo * nt + tx] = reg[0]

    @T.prim_func(private=True)
    def func(xw: T.Buffer((steps, batch, cell.gates * hid), dt), r_p: T.Buffer((cell.chunks, hid, CHUNK), dt),
             rb_h: T.Buffer((hid,), dt),
             p: T.Buffer((3 * hid,), dt), h0: T.Buffer((batch, hid), dt), c0: T.Buffer((batch, hid), dt),
             y: T.Buffer((steps, batch, hid), dt), h_last: T.Buffer((batch, hid), dt),
             c_last: T.Buffer((batch, hid), dt)):
        bx = T.launch_thread("blockIdx.x", batch)
        tx = T.launch_thread("threadIdx.x", nt)
        h = T.alloc_buffer((per * nt,), dt, scope="shared")
        h_next = T.alloc_buffer((per * nt,), dt, scope="shared")
        rh = T.alloc_buffer((per * nt,), dt, scope="shared")
        acc = T.alloc_buffer((rounds * nt + 2 * hp,), dt, scope="shared")
        c = T.alloc_buffer((per,), dt, scope="local")
        for io in range(per):
            h[io * nt + tx] = h0[bx, unit(io, tx)]
            if lstm:
                c[io] = c0[bx, unit(io, tx)]
        T.tvm_storage_sync("shared")
        for s in range(steps):
            matvec(acc, h, r_p, tx, 0, cols)
            T.tvm_storage_sync("shared")
            if gru and not lbr:                         # n = g(x_h + (r * h) @ R_h^T + Rb_h)
                for io in range(per):
                    rh[io * nt + tx] = f(xw[tt(s), bx, hid + unit(io, tx)] + acc[hp + unit(io, tx)]) \
                        * h[io * nt + tx]
                T.tvm_storage_sync("shared")
                matvec(acc, rh, r_p, tx, 2 * hp, hp)
                T.tvm_storage_sync("shared")
            for io in range(per):
                if gru:
                    h_next[io * nt + tx] = (one - f(xw[tt(s), bx, unit(io, tx)] + acc[unit(io, tx)])) * (
                        g(xw[tt(s), bx, 2 * hid + unit(io, tx)]
                          + f(xw[tt(s), bx, hid + unit(io, tx)] + acc[hp + unit(io, tx)])
                          * (acc[2 * hp + unit(io, tx)] + rb_h[unit(io, tx)])) if lbr else
                        g(xw[tt(s), bx, 2 * hid + unit(io, tx)] + acc[2 * hp + unit(io, tx)] + rb_h[unit(io, tx)])) \
                        + f(xw[tt(s), bx, unit(io, tx)] + acc[unit(io, tx)]) * h[io * nt + tx]
                elif lstm:
                    gi = f(xw[tt(s), bx, unit(io, tx)] + acc[unit(io, tx)] + (p[unit(io, tx)] * c[io] if peep else zero))
                    gf = one - gi if cell.input_forget else \
                        f(xw[tt(s), bx, 2 * hid + unit(io, tx)] + acc[2 * hp + unit(io, tx)]
                          + (p[2 * hid + unit(io, tx)] * c[io] if peep else zero))
                    c[io] = gf * c[io] + gi * g(xw[tt(s), bx, 3 * hid + unit(io, tx)] + acc[3 * hp + unit(io, tx)])
                    h_next[io * nt + tx] = f(xw[tt(s), bx, hid + unit(io, tx)] + acc[hp + unit(io, tx)]
                                             + (p[hid + unit(io, tx)] * c[io] if peep else zero)) * h_act(c[io])
                else:
                    h_next[io * nt + tx] = f(xw[tt(s), bx, unit(io, tx)] + acc[unit(io, tx)])
            T.tvm_storage_sync("shared")
            for io in range(per):
                h[io * nt + tx] = h_next[io * nt + tx]
                if io * nt + tx < hid:
                    y[tt(s), bx, io * nt + tx] = h_next[io * nt + tx]
            T.tvm_storage_sync("shared")
        for io in range(per):
            if io * nt + tx < hid:
                h_last[bx, io * nt + tx] = h[io * nt + tx]
                if lstm:
                    c_last[bx, io * nt + tx] = c[io]

    return only_params(func, cell)
