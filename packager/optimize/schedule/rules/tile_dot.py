"""bf16 matmuls and convolutions on AMX tiles (issue 47's `optimize.precision: bf16` on x86).

The bf16 pass (optimize/bf16.py) emits each conv or matmul it converts as a kernel of plain loops
tagged with its geometry (`TileDot`, the ATTR attribute), as recurrent layers are: its loops are
the reference (bf16 operands widened to float32 exactly, float32 sums), correct on any CPU and
what the untimed check compares against. The CPU rules regenerate it for a target with AMX-BF16
(`amx_kernel`): per task a block of up to 2 x 2 accumulator tiles (R positions x 16 output
channels each, float32) in tmm0-3, the activation rows in tmm4-5 and the weight panels in tmm6-7:

    parallel for (image, row-tile block, column-tile block)
      configure the tiles (ldtilecfg: the configuration is per thread), zero the accumulators
      for (ky, kx, 32-channel chunk): load 1-2 activation tiles (R rows, stride = the conv's
          x-stride times the channels), 1-2 panel tiles (16 rows of 16 channel pairs); tdpbf16ps each pair
      store the accumulators and write them out (NC[H]W transposed, a matmul's rows as they are)

An activation tile's rows are R consecutive output positions along x (a 1x1 stride-1 unpadded
conv and a matmul: along all positions); its 64 bytes are 32 consecutive input channels. The input
is channels-last bf16 (stored as uint16: TVM legalizes any bfloat16-typed value to float32 before
LLVM sees it, and AMX takes operands by pointer), its channels a multiple of 32. Weights are
panels [OC/16, KH, KW, C/2, 16, 2]: one 16 x 64-byte tile per (panel, tap, chunk).

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
PANEL = 16                       # output channels per panel tile (16 float32 columns)
_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA = 158, 0x1023, 18


def tile_height(positions: int) -> int:
    """Positions per accumulator tile for a row of `positions`: the most, up to 16, that divide it."""
    return max(r for r in range(1, 17) if positions % r == 0)


@dataclass(frozen=True)
class TileDot:
    """A conv (or matmul) over a channels-last bf16 input [batch, hp, wp, channels]: out[b, o, p] (NC[H]W,
    positions p = y * px + x) or, `rows`, out[b * positions + p, o] (a matmul's [M, N])."""

    batch: int
    hp: int
    wp: int
    channels: int                # a multiple of CHUNK
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


def _shapes(g: TileDot):
    positions = g.py * g.px
    out = (g.batch * positions, g.out_channels) if g.rows else (g.batch, g.out_channels, positions)
    return ((g.batch, g.hp, g.wp, g.channels), (g.out_channels // PANEL, g.kh, g.kw, g.channels // 2, PANEL, 2),
            out, g.batch * positions * g.out_channels)


@cache                      # a model's layers repeat geometries; parsing the script is the cost
def reference_kernel(g: TileDot) -> tirx.PrimFunc:
    """The plain loops: out = sum over taps and channels of float32(x) * float32(w), tagged."""
    xs, ws, outs, n_out = _shapes(g)
    hp, wp, c, oc, kh, kw, py, px = g.hp, g.wp, g.channels, g.out_channels, g.kh, g.kw, g.py, g.px
    sy, sx, dy, dx, rows = g.sy, g.sx, g.dy, g.dx, g.rows

    @T.prim_func(private=True)
    def f(x: T.Buffer(xs, "uint16"), w: T.Buffer(ws, "uint16"), out: T.Buffer(outs, "float32")):
        xf = T.decl_buffer((xs[0] * hp * wp * c,), "uint16", data=x.data)
        wf = T.decl_buffer((oc * kh * kw * c,), "uint16", data=w.data)
        of_ = T.decl_buffer((n_out,), "float32", data=out.data)
        for b, y, xx, o in T.grid(xs[0], py, px, oc):
            acc = T.decl_buffer((1,), "float32", scope="local")
            acc[0] = T.float32(0)
            for ky, kx, ch in T.grid(kh, kw, c):
                acc[0] = acc[0] + _bf16(xf[((b * hp + y * sy + ky * dy) * wp + xx * sx + kx * dx) * c + ch]) * _bf16(
                    wf[((((o // PANEL) * kh + ky) * kw + kx) * (c // 2) + ch // 2) * PANEL * 2 + o % PANEL * 2 + ch % 2])
            if rows:
                of_[((b * py + y) * px + xx) * oc + o] = acc[0]
            else:
                of_[((b * oc + o) * py + y) * px + xx] = acc[0]
    return f.with_attr(ATTR, g.to_json()).with_attr("tirx.noalias", True)


@cache
def amx_kernel(g: TileDot) -> tirx.PrimFunc:
    """The AMX-BF16 kernel of `g` (module docstring), tagged like its reference."""
    xs, ws, outs, n_out = _shapes(g)
    hp, wp, c, oc, kh, kw, py, px = g.hp, g.wp, g.channels, g.out_channels, g.kh, g.kw, g.py, g.px
    sy, sx, dy, dx, rows = g.sy, g.sx, g.dy, g.dx, g.rows
    r, tiles_x, mt, nt, _ = g.blocking()
    rb, cb, chunks = py * tiles_x // mt, oc // PANEL // nt, c // CHUNK
    a_stride, o_stride = sx * c * 2, oc * 4

    @T.prim_func(private=True)
    def f(x: T.Buffer(xs, "uint16"), w: T.Buffer(ws, "uint16"), out: T.Buffer(outs, "float32")):
        xf = T.decl_buffer((xs[0] * hp * wp * c,), "uint16", data=x.data)
        wf = T.decl_buffer((oc * kh * kw * c,), "uint16", data=w.data)
        of_ = T.decl_buffer((n_out,), "float32", data=out.data)
        for task in T.parallel(xs[0] * rb * cb):
            cfg = T.decl_buffer((64,), "uint8", scope="local")
            acc = T.decl_buffer((mt * nt * r * PANEL,), "float32", scope="local")
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
                        + k * CHUNK]), T.int64(a_stride))
                for j in T.unroll(nt):
                    T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(6 + j), T.address_of(wf[
                        (((o0 + j) * kh + ky) * kw + kx) * c * PANEL + k * CHUNK * PANEL]), T.int64(64))
                for i in T.unroll(mt):
                    for j in T.unroll(nt):
                        T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.uint8(i * nt + j), T.uint8(4 + i),
                                           T.uint8(6 + j))
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


def has_amx(target) -> bool:
    """Whether LLVM may emit AMX-BF16 for this CPU target (a named CPU that has it, or the mattr)."""
    return target.arch == "x86_64" and "amx-bf16" in target.llvm_features


def cpu(func: tirx.PrimFunc, target) -> tuple[tirx.PrimFunc, KernelSchedule] | None:
    """The AMX form of a TileDot kernel on a target with AMX-BF16; None for any other kernel or target."""
    g = of(func)
    if g is None or not has_amx(target):
        return None
    request_amx()              # this process may time or check the kernel
    r, *_, tasks = g.blocking()
    info = KernelSchedule("amx", parallel=tasks, vector=PANEL, register_tile=r * PANEL, note=f"tdpbf16ps, {r}-row tiles")
    return amx_kernel(g).with_attrs(dict(func.attrs)), info
