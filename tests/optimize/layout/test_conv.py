"""Packed-layout conv computes equal the NCHW convolution: data and weights packed with the
layout primitives, the output unpacked with them, compared with a numpy reference."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from packager.optimize.layout.conv import ConvLayouts, conv2d_packed, parse_data_layout, parse_kernel_layout
from packager.optimize.layout.primitives import channel_blocked, conv_weight_blocked

RNG = np.random.default_rng(0)


def conv_ref(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - (kh - 1) * dil - 1) // stride + 1
    ow = (wd + pad[1] + pad[3] - (kw - 1) * dil - 1) // stride + 1
    out = np.zeros((n, o, oh, ow), np.float64)
    og = o // groups
    for oc in range(o):
        g = oc // og
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, ky * dil:ky * dil + stride * oh:stride,
                           kx * dil:kx * dil + stride * ow:stride][:, :, :oh, :ow]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, ky, kx])
    return out.astype(np.float32)


# (data NCHW, weight OIHW, stride, pad (t, l, b, r), dilation, groups, data block, out block)
CASES = {
    "plain": ((1, 8, 9, 9), (16, 8, 3, 3), 1, (1, 1, 1, 1), 1, 1, 1, 1),
    "blocked_16_16": ((1, 32, 8, 8), (32, 32, 3, 3), 1, (1, 1, 1, 1), 1, 1, 16, 16),
    "first_conv_rgb_in_nchw": ((1, 3, 11, 11), (32, 3, 3, 3), 2, (1, 1, 1, 1), 1, 1, 1, 16),
    "in16_out32_1x1_stride2": ((2, 32, 10, 10), (64, 32, 1, 1), 2, (0, 0, 0, 0), 1, 1, 16, 32),
    "in32_out16": ((1, 64, 6, 6), (32, 64, 3, 3), 1, (0, 1, 2, 1), 1, 1, 32, 16),
    "packed_in_nchw_out": ((1, 16, 7, 7), (10, 16, 1, 1), 1, (0, 0, 0, 0), 1, 1, 16, 1),
    "depthwise": ((1, 32, 9, 9), (32, 1, 3, 3), 1, (1, 1, 1, 1), 1, 32, 16, 16),
    "depthwise_stride2_out32": ((1, 64, 10, 10), (64, 1, 3, 3), 2, (1, 1, 1, 1), 1, 64, 32, 32),
    "grouped": ((1, 32, 6, 6), (32, 16, 3, 3), 1, (1, 1, 1, 1), 1, 2, 16, 16),
    "dilated": ((1, 16, 12, 12), (16, 16, 3, 3), 1, (2, 2, 2, 2), 2, 1, 16, 16),
    "depthwise_packed_in_nchw_out": ((1, 16, 7, 7), (16, 1, 3, 3), 1, (1, 1, 1, 1), 1, 16, 8, 1),
}


@pytest.mark.parametrize("name", CASES)
def test_packed_conv_equals_nchw_conv(name):
    dshape, wshape, stride, pad, dil, groups, db, ob = CASES[name]
    x = RNG.standard_normal(dshape).astype(np.float32)
    w = RNG.standard_normal(wshape).astype(np.float32)
    cg = wshape[1]
    w_in = db if db > 1 and cg % db == 0 else 1
    x_seq = channel_blocked(dshape, 1, db)
    w_seq = conv_weight_blocked(wshape, w_in, ob) if (w_in, ob) != (1, 1) else channel_blocked(wshape, 1, 1)
    xt = te.placeholder(x_seq.shape(), "float32", "x")
    wt = te.placeholder(w_seq.shape(), "float32", "w")
    y = conv2d_packed(xt, wt, ConvLayouts(db, w_in, ob, ob), dshape[1], wshape[0], (stride, stride), pad, (dil, dil),
                      groups, "float32")
    lib = tvm.tirx.build(te.create_prim_func([xt, wt, y]), target="llvm")
    out = tvm.runtime.tensor(np.zeros([int(d) for d in y.shape], np.float32))
    lib(tvm.runtime.tensor(x_seq.apply_np(x)), tvm.runtime.tensor(w_seq.apply_np(w)), out)
    ref = conv_ref(x, w, stride, pad, dil, groups)
    got = channel_blocked(ref.shape, 1, ob).invert_np(out.numpy())
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_indices_are_simplified_for_region_analysis():
    """(oo*16 + ov) // 16 must read as oo: div/mod chains in the reads defeat fusion and tiling."""
    xt = te.placeholder((1, 2, 8, 8, 16), "float32", "x")
    wt = te.placeholder((2, 1, 3, 3, 1, 16), "float32", "w")
    y = conv2d_packed(xt, wt, ConvLayouts(16, 1, 16, 16), 32, 32, (1, 1), (1, 1, 1, 1), (1, 1), 32, "float32")
    text = te.create_prim_func([xt, wt, y]).script()
    assert "//" not in text.split("conv2d_packed")[-1] and "%" not in text.split("conv2d_packed")[-1]


def test_layout_strings():
    assert parse_data_layout("NCHW") == 1 and parse_data_layout("NCHW16c") == 16
    assert parse_kernel_layout("OIHW") == (1, 1) and parse_kernel_layout("OIHW3i32o") == (3, 32)
    with pytest.raises(ValueError):
        parse_data_layout("NHWC")
