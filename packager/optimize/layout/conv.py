"""TE computes for convolutions over packed (channel-blocked) layouts.

TVM 0.27's LegalizeOps leaves a conv2d with a packed layout (NCHW16c / OIHW16i16o) unlowered, and
rewriting a legalized NCHW kernel with transform_layout leaves div/mod chains that defeat fusion and
region analysis. So, as ALT does, the compute is written over the new domain: the output layout
N (O/o_t) H W o_t defines the loop nest, and every input is read at its own layout's index of the
same logical element. Reduction axes are split by the weight's input block so that no index needs
a division by a loop variable's bound.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
from tvm import relax, te, tirx, topi


@dataclass(frozen=True)
class ConvLayouts:
    """Channel blocks of one conv: data (1 = plain NCHW), weight input/output, output (1 = NCHW)."""

    data_block: int
    weight_in: int
    weight_out: int
    out_block: int


def bounded_simplifier(vars_extents: list[tuple[tirx.Var, int]]):
    """Simplify index expressions knowing each loop variable's range, so that (o*16 + v) // 16
    becomes o: without the bounds the div/mod chains stay and region analysis gives up."""
    ana = tvm.sym.Analyzer()
    for v, ext in vars_extents:
        ana.bind(v, tvm.ir.Range(0, ext))
    return ana.simplify


def _data_reader(data: te.Tensor, block: int, simplify):
    """Logical data[n, c, h, w] read from NCHW (block 1) or NCHW{block}c storage."""
    if block == 1:
        return lambda n, c, h, w: data[n, simplify(c), h, w]
    return lambda n, c, h, w: data[n, simplify(tirx.floordiv(c, block)), h, w, simplify(tirx.floormod(c, block))]


def conv2d_packed(data: te.Tensor, weight: te.Tensor, lay: ConvLayouts, channels: int, out_channels: int,
                  strides: tuple[int, int], padding: tuple[int, int, int, int], dilation: tuple[int, int],
                  groups: int, out_dtype: str) -> te.Tensor:
    """conv2d with data NCHW[b]c, weight OIHW[i]i[o]o, output NCHW[o]c (grouped/depthwise included).

    Weight shape: (O/o, (C/g)/i, KH, KW, i, o), or plain OIHW when both its blocks are 1. Output
    shape: (N, O/o, OH, OW, o), or NCHW when out_block is 1 (then the weight's o block is 1 too)."""
    n = data.shape[0]
    h, w = (data.shape[2], data.shape[3])
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = (int(h) + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (int(w) + pl + pr - (kw - 1) * dw - 1) // sw + 1
    cg, og = channels // groups, out_channels // groups
    wi, wo, ob = lay.weight_in, lay.weight_out, lay.out_block
    if any(p for p in padding):
        zeros = [0] * (len(data.shape) - 4)
        data = topi.nn.pad(data, [0, 0, pt, pl] + zeros, [0, 0, pb, pr] + zeros, name="pad")
    rco = te.reduce_axis((0, cg // wi), name="rco")
    rci = te.reduce_axis((0, wi), name="rci")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    reduce_bounds = [(a.var, int(a.dom.extent)) for a in (rco, rci, ry, rx)]
    plain_weight = len(weight.shape) == 4            # OIHW: blocks (1, 1), e.g. packed depthwise in, NCHW out

    def body(nn, o, y, x, bounds):
        s = bounded_simplifier(bounds + reduce_bounds)
        read = _data_reader(data, lay.data_block, s)
        c = (o // og) * cg + rco * wi + rci if groups > 1 else rco * wi + rci
        w = weight[o, rco, ry, rx] if plain_weight else weight[s(o // wo), rco, ry, rx, rci, s(o % wo)]
        return te.sum(read(nn, c, y * sh + ry * dh, x * sw + rx * dw).astype(out_dtype) * w.astype(out_dtype),
                      axis=[rco, rci, ry, rx])

    if ob == 1:
        return te.compute((n, out_channels, oh, ow),
                          lambda nn, o, y, x: body(nn, o, y, x, [(o, out_channels)]), name="conv2d_packed")
    return te.compute((n, out_channels // ob, oh, ow, ob),
                      lambda nn, oo, y, x, ov: body(nn, oo * ob + ov, y, x, [(oo, out_channels // ob), (ov, ob)]),
                      name="conv2d_packed")


def parse_data_layout(layout: str) -> int:
    """"NCHW" -> 1, "NCHW16c" -> 16; anything else is not ours."""
    if layout == "NCHW":
        return 1
    m = re.fullmatch(r"NCHW(\d+)c", layout)
    if not m:
        raise ValueError(f"unsupported data layout {layout}")
    return int(m.group(1))


def parse_kernel_layout(layout: str) -> tuple[int, int]:
    """"OIHW" -> (1, 1), "OIHW16i32o" -> (16, 32)."""
    if layout == "OIHW":
        return 1, 1
    m = re.fullmatch(r"OIHW(\d+)i(\d+)o", layout)
    if not m:
        raise ValueError(f"unsupported kernel layout {layout}")
    return int(m.group(1)), int(m.group(2))


def _default_conv2d_legalize():
    return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """LegalizeOps hook for relax.nn.conv2d: packed layouts get the compute above, plain NCHW
    convs TVM's own legalization."""
    a = call.attrs
    if (a.data_layout, a.kernel_layout, a.out_layout or a.data_layout) == ("NCHW", "OIHW", "NCHW"):
        return _default_conv2d_legalize()(bb, call)
    data_block = parse_data_layout(a.data_layout)
    out_block = parse_data_layout(a.out_layout or a.data_layout)
    w_in, w_out = parse_kernel_layout(a.kernel_layout)
    if w_out != out_block:
        raise ValueError(f"kernel layout {a.kernel_layout} does not match output layout {a.out_layout}")
    data_shape = [int(d) for d in call.args[0].ty.shape]
    w_shape = [int(d) for d in call.args[1].ty.shape]
    channels = data_shape[1] * (data_shape[4] if data_block > 1 else 1)
    out_channels = w_shape[0] * w_out
    out_dtype = a.out_dtype if a.out_dtype and str(a.out_dtype) != "void" else call.args[0].ty.dtype
    lay = ConvLayouts(data_block, w_in, w_out, out_block)
    strides, padding = tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding)
    dilation, groups = tuple(int(d) for d in a.dilation), int(a.groups)
    return bb.call_te(lambda x, w: conv2d_packed(x, w, lay, channels, out_channels, strides, padding, dilation,
                                                 groups, str(out_dtype)),
                      call.args[0], call.args[1], primfunc_name_hint="conv2d_packed")
