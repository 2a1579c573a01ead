"""A kernel's work from its TIR (kernel_cost.py): blocks count their iteration domain, and a
kernel written as plain loops (a recurrent layer's time loop) counts each store times the loops
around it, so the roofline in `pack bench` places it too."""
from __future__ import annotations

from tvm import te

from packager.frontend.recurrent_kernel import Cell, kernel
from packager.optimize.kernel_cost import kernel_cost


def test_a_matmul_block_counts_a_multiply_add_per_point():
    a, b = te.placeholder((8, 16), name="a"), te.placeholder((16, 4), name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    cost = kernel_cost(te.create_prim_func([a, b, c]))
    assert cost.flops == 2 * 8 * 4 * 16 and cost.bytes == 4 * (8 * 16 + 16 * 4 + 8 * 4)


def test_a_recurrent_loop_counts_every_step():
    acts = (("Sigmoid", None, None), ("Tanh", None, None), ("Tanh", None, None))
    one, hundred = (kernel_cost(kernel(Cell("LSTM", steps, 1, 64, acts))).flops for steps in (1, 100))
    assert one >= 2 * 4 * 64 * 64                      # h @ R^T: a multiply-add per gate column and unit
    assert hundred == 100 * one
