"""Matmuls and convolutions on AMX tiles (issue 47): bf16 (`optimize.precision: bf16` on x86) and
the u8 x s8 sums of QDQ models (optimize/int8.py).

The bf16 and int8 passes emit each conv or matmul they convert as a kernel of plain loops tagged
with its geometry (`TileDot`, the ATTR attribute), as recurrent layers are: its loops are the
reference (bf16 operands widened to float32 exactly with float32 sums; or 8-bit operands widened
to int32, exact int32 sums), correct on any CPU and what the untimed check compares against. The
CPU rules regenerate it for a target with the kind's AMX unit (`amx_kernel`: AMX-BF16's
`tdpbf16ps`, AMX-INT8's `tdpbusd`): per task a block of up to 2 x 2 accumulator tiles (R positions
x 16 output channels each, float32 or int32) in tmm0-3, the activation rows in tmm4-5 and the
weight panels in tmm6-7:

    parallel for (image, row-tile block, column-tile block)
      configure the tiles (ldtilecfg: the configuration is per thread), zero the accumulators
      for (ky, kx, 64-byte chunk of channels): load 1-2 activation tiles (R rows, stride = the
          conv's x-stride times the channels), 1-2 panel tiles (16 rows of 16 channel pairs or quads);
          tdpbf16ps / tdpbusd each pair
      store the accumulators and write them out (NC[H]W transposed, a matmul's rows as they are)

An activation tile's rows are R consecutive output positions along x (a 1x1 stride-1 unpadded
conv and a matmul: along all positions); its 64 bytes are 32 consecutive bf16 input channels or
64 uint8 ones. The input is channels-last, bf16 stored as uint16 (TVM legalizes any bfloat16-typed
value to float32 before LLVM sees it, and AMX takes operands by pointer) or uint8, its channels
a multiple of the chunk. Weights are panels [OC/16, KH, KW, C/G, 16, G] (G = 2 bf16 or 4 int8):
one 16 x 64-byte tile per (panel, tap, chunk).

Linux hands a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM);
`request_amx` asks for it in this process (timing, checks), the C++ runtime asks at start.
"""
from __future__ import annotations

import ctypes
import json
from dataclasses import asdict, dataclass
from functools import cache

from tvm import tirx
from tvm.script import tirx as T

from ..tir_util import KernelSchedule

ATTR = "packager.tile_dot"       # PrimFunc attribute: the TileDot as JSON
CHUNK = 32                       # bf16 channels per activation tile row (64 bytes)
PANEL = 16                       # output channels per panel tile (16 float32 or int32 columns)
MIN_PADDED = 64                  # fewer input channels are padded to a whole chunk only when already whole
_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA = 158, 0x1023, 18


@dataclass(frozen=True)
class Kind:
    """What a TileDot multiplies: operand storage types, products per 32-bit lane (G), sum type,
    the AMX instruction and the LLVM feature it needs."""

    activation: str
    weight: str
    group: int
    out: str
    instruction: str
    feature: str

    @property
    def chunk(self) -> int:
        """Input channels per 64-byte tile row."""
        return 64 // (4 // self.group)


KINDS = {"bf16": Kind("uint16", "uint16", 2, "float32", "llvm.x86.tdpbf16ps", "amx-bf16"),
         "u8s8": Kind("uint8", "int8", 4, "int32", "llvm.x86.tdpbusd", "amx-int8")}


def tile_height(positions: int) -> int:
    """Positions per accumulator tile for a row of `positions`: the most, up to 16, that divide it."""
    return max(r for r in range(1, 17) if positions % r == 0)


def tile_channels(kind: str, c: int) -> int | None:
    """The input channels a TileDot of `kind` computes over for c: c in whole 64-byte chunks
    (zero-weight channels filling the last), None when c is under MIN_PADDED and not a chunk
    (a 3-channel stem padded to a chunk would multiply mostly zeros)."""
    chunk = KINDS[kind].chunk
    return c - c % -chunk if c % chunk == 0 or c >= MIN_PADDED else None


def tile_unfit(kind: str, c: int, out_channels: int, positions: int) -> str:
    """Why a conv or matmul of c input channels, `out_channels` outputs and rows of `positions`
    output positions does not take a TileDot of `kind` ("" when it does)."""
    if tile_channels(kind, c) is None:
        return f"input channels below {MIN_PADDED}, not a multiple of {KINDS[kind].chunk}"
    if out_channels % PANEL:
        return "output channels not a multiple of 16"
    if positions >= 4 and tile_height(positions) < 4:
        return "positions per row with no divisor from 4 to 16"
    return ""


def tiled_rows(m: int) -> int:
    """The rows a matmul of m rows computes: m where a tile height from 4 to 16 divides it (or m
    is below 4: one tile), else m rounded up to 16 (zero rows, sliced off after: ViT's 197 tokens)."""
    return m if m < 4 or tile_height(m) >= 4 else m - m % -PANEL


@dataclass(frozen=True)
class TileDot:
    """A conv (or matmul) over a channels-last input [batch, hp, wp, channels] of `kind` (KINDS:
    bf16 bits, or uint8 against int8 weights): out[b, o, p] (NC[H]W, positions p = y * px + x)
    or, `rows`, out[b * positions + p, o] (a matmul's [M, N])."""

    batch: int
    hp: int
    wp: int
    channels: int                # a multiple of the kind's chunk
    out_channels: int            # a multiple of PANEL
    kh: int
    kw: int
    py: int                      # output positions: py rows of px (a flattened conv, a matmul: 1 row)
    px: int
    sy: int = 1
    sx: int = 1
    dy: int = 1
    dx: int = 1
    rows: bool = False
    kind: str = "bf16"

    @property
    def k(self) -> Kind:
        return KINDS[self.kind]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "TileDot":
        return TileDot(**json.loads(text))

    @property
    def tile_rows(self) -> int:
        """Positions per accumulator tile: the most up to 16 that divide a row of positions."""
        return tile_height(self.px)

    def blocking(self) -> tuple[int, int, int, int, int]:
        """(tile rows, row tiles per row of positions, accumulator tiles along positions and along
        output channels per task (1 or 2 each), tasks)."""
        r = self.tile_rows
        tiles_x = self.px // r
        mt = 2 if self.py * tiles_x % 2 == 0 else 1
        nt = 2 if self.out_channels // PANEL % 2 == 0 else 1
        return r, tiles_x, mt, nt, self.batch * self.py * tiles_x // mt * (self.out_channels // PANEL // nt)


def of(func: tirx.PrimFunc) -> TileDot | None:
    """The TileDot `func` computes, None for any other kernel."""
    text = func.attrs.get(ATTR) if func.attrs is not None else None
    return TileDot.from_json(str(text)) if text is not None else None


@cache
def request_amx() -> bool:
    """Whether this process may use AMX tiles (Linux: asked once; elsewhere, or refused: False)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _bf16(v):
    """A bf16 value stored as uint16, widened to float32 (exact: the high half of its bits)."""
    return T.reinterpret(T.shift_left(T.Cast("uint32", v), T.uint32(16)), dtype="float32")


def _int32(v):
    return T.Cast("int32", v)


def _shapes(g: TileDot):
    positions, group = g.py * g.px, g.k.group
    out = (g.batch * positions, g.out_channels) if g.rows else (g.batch, g.out_channels, positions)
    return ((g.batch, g.hp, g.wp, g.channels), (g.out_channels // PANEL, g.kh, g.kw, g.channels // group, PANEL, group),
            out, g.batch * positions * g.out_channels)


@cache                      # a model's layers repeat geometries; parsing the script is the cost
def reference_kernel(g: TileDot) -> tirx.PrimFunc:
    """The plain loops: out = sum over taps and channels of widen(x) * widen(w) (float32, or int32
    for u8s8), tagged."""
    xs, ws, outs, n_out = _shapes(g)
    hp, wp, c, oc, kh, kw, py, px = g.hp, g.wp, g.channels, g.out_channels, g.kh, g.kw, g.py, g.px
    sy, sx, dy, dx, rows = g.sy, g.sx, g.dy, g.dx, g.rows
    xt, wt, ot, grp = g.k.activation, g.k.weight, g.k.out, g.k.group
    widen = _bf16 if g.kind == "bf16" else _int32

    @T.prim_func(private=True)
    def f(x: T.Buffer(xs, xt), w: T.Buffer(ws, wt), out: T.Buffer(outs, ot)):
        xf = T.decl_buffer((xs[0] * hp * wp * c,), xt, data=x.data)
        wf = T.decl_buffer((oc * kh * kw * c,), wt, data=w.data)
        of_ = T.decl_buffer((n_out,), ot, data=out.data)
        for b, y, xx, o in T.grid(xs[0], py, px, oc):
            acc = T.decl_buffer((1,), ot, scope="local")
            acc[0] = T.Cast(ot, 0)
            for ky, kx, ch in T.grid(kh, kw, c):
                acc[0] = acc[0] + widen(xf[((b * hp + y * sy + ky * dy) * wp + xx * sx + kx * dx) * c + ch]) * widen(
                    wf[((((o // PANEL) * kh + ky) * kw + kx) * (c // grp) + ch // grp) * PANEL * grp + o % PANEL * grp
                       + ch % grp])
            if rows:
                of_[((b * py + y) * px + xx) * oc + o] = acc[0]
            else:
                of_[((b * oc + o) * py + y) * px + xx] = acc[0]
    return f.with_attr(ATTR, g.to_json()).with_attr("tirx.noalias", True)


@cache
def amx_kernel(g: TileDot) -> tirx.PrimFunc:
    """The AMX kernel of `g` (module docstring), tagged like its reference."""
    xs, ws, outs, n_out = _shapes(g)
    hp, wp, c, oc, kh, kw, py, px = g.hp, g.wp, g.channels, g.out_channels, g.kh, g.kw, g.py, g.px
    sy, sx, dy, dx, rows = g.sy, g.sx, g.dy, g.dx, g.rows
    xt, wt, ot, dot, chunk = g.k.activation, g.k.weight, g.k.out, g.k.instruction, g.k.chunk
    r, tiles_x, mt, nt, _ = g.blocking()
    rb, cb, chunks = py * tiles_x // mt, oc // PANEL // nt, c // chunk
    a_stride, o_stride = sx * c * (4 // g.k.group), oc * 4

    @T.prim_func(private=True)
    def f(x: T.Buffer(xs, xt), w: T.Buffer(ws, wt), out: T.Buffer(outs, ot)):
        xf = T.decl_buffer((xs[0] * hp * wp * c,), xt, data=x.data)
        wf = T.decl_buffer((oc * kh * kw * c,), wt, data=w.data)
        of_ = T.decl_buffer((n_out,), ot, data=out.data)
        for task in T.parallel(xs[0] * rb * cb):
            cfg = T.decl_buffer((64,), "uint8", scope="local")
            acc = T.decl_buffer((mt * nt * r * PANEL,), ot, scope="local")
            b = task // (rb * cb)
            t0 = task % rb * mt                               # first row tile of the block
            o0 = task // rb % cb * nt                         # first panel of the block
            for i in range(64):
                cfg[i] = T.uint8(0)
            cfg[0] = T.uint8(1)                               # palette 1
            for t in range(8):
                cfg[16 + 2 * t] = T.uint8(64)                 # bytes per row
                cfg[48 + t] = T.Select(t >= 6, T.uint8(16), T.uint8(r))
            T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0]))
            for t in T.unroll(mt * nt):
                T.call_llvm_intrin("void", "llvm.x86.tilezero", T.uint8(t))
            for ky, kx, k in T.grid(kh, kw, chunks):
                for i in T.unroll(mt):
                    T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(4 + i), T.address_of(xf[
                        ((b * hp + (t0 + i) // tiles_x * sy + ky * dy) * wp + (t0 + i) % tiles_x * r * sx + kx * dx) * c
                        + k * chunk]), T.int64(a_stride))
                for j in T.unroll(nt):
                    T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(6 + j), T.address_of(wf[
                        (((o0 + j) * kh + ky) * kw + kx) * c * PANEL + k * chunk * PANEL]), T.int64(64))
                for i in T.unroll(mt):
                    for j in T.unroll(nt):
                        T.call_llvm_intrin("void", dot, T.uint8(i * nt + j), T.uint8(4 + i), T.uint8(6 + j))
            if rows:
                for i in T.unroll(mt):
                    for j in T.unroll(nt):
                        T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(i * nt + j), T.address_of(of_[
                            (b * py * px + (t0 + i) // tiles_x * px + (t0 + i) % tiles_x * r) * oc + (o0 + j) * PANEL]),
                            T.int64(o_stride))
            else:
                for i in T.unroll(mt):
                    for j in T.unroll(nt):
                        T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(i * nt + j),
                                           T.address_of(acc[(i * nt + j) * r * PANEL]), T.int64(PANEL * 4))
                for i, j, ch in T.grid(mt, nt, PANEL):
                    for p in T.vectorized(r):
                        of_[((b * oc + (o0 + j) * PANEL + ch) * py + (t0 + i) // tiles_x) * px
                            + (t0 + i) % tiles_x * r + p] = acc[((i * nt + j) * r + p) * PANEL + ch]
            T.call_llvm_intrin("void", "llvm.x86.tilerelease")
    return f.with_attr(ATTR, g.to_json()).with_attr("tirx.noalias", True)


def has_amx(target, kind: str = "bf16") -> bool:
    """Whether LLVM may emit the kind's AMX instruction for this CPU target (a named CPU that has
    the unit, or the mattr)."""
    return target.arch == "x86_64" and KINDS[kind].feature in target.llvm_features


def cpu(func: tirx.PrimFunc, target) -> tuple[tirx.PrimFunc, KernelSchedule] | None:
    """The AMX form of a TileDot kernel on a target with its kind's AMX unit; None for any other
    kernel or target."""
    g = of(func)
    if g is None or not has_amx(target, g.kind):
        return None
    request_amx()              # this process may time or check the kernel
    r, *_, tasks = g.blocking()
    info = KernelSchedule("amx", parallel=tasks, vector=PANEL, register_tile=r * PANEL,
                          note=f"{g.k.instruction.split('.')[-1]}, {r}-row tiles")
    return amx_kernel(g).with_attrs(dict(func.attrs)), info
