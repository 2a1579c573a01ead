"""The CPU rule for the integer matmuls and convolutions of QDQ models (optimize/int8.py makes
them):

    C[..., m, n] = sum_k int32(A[..., m, k]) * int32(B[n // L, k // 2, n % L, k % 2])
    C[b, o, y, x] = sum_(ky, kx, k) int32(A[b, y*s + ky*d, x*s + kx*d, k]) * int32(B[o // L, ky, kx, k // 2, o % L, k % 2])
    (and the same over x alone: a conv1d)

A is int16 (a quantized activation minus its zero point), B the int8 weights packed in pairs of
k (INT_LANES columns per panel), C exact int32. On x86 the step over L lanes x 2 k is one
`vpmaddwd` (llvm.x86.avx2.pmadd.wd: sixteen 16-bit products summed in pairs into eight int32,
no saturation) on a broadcast activation pair and the panel's sign-extended weights; it is the
TensorIntrin PAIR_DOT below, tensorized. Elsewhere (arm64) the same loops are vectorized by LLVM.

    parallel for (batch, column panels of nr vectors, row tiles of mr rows)
      for k pairs: for mr rows: for nr vectors: C_tile[row, vector] += pair_dot(A pair, B panel)
      write the tile back through the element-wise epilogue (scale, bias, activation, requantize)

Column panels run outside the row tiles so a panel (K x nr*L int8) stays in L1 while every row
passes it. mr and nr divide M and N/L (tensorize takes no tail); 4 x 3 accumulators plus the
broadcast pair and a panel vector fill AVX2's 16 registers. A convolution is the same loops with
output positions along x (or y, for a map 1-3 wide) as rows and output channels as columns; its
int32 tile is laid out [channel panel][position][L] so each vector of L channels is contiguous.
"""
from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..tir_util import PARALLEL_MIN_WORK, KernelSchedule, RuleMismatch, best_factor, loop_extent

INT_LANES = 8                  # int32 accumulators per vector: 256-bit registers (AVX2; AVX-512 runs them too)
PAIR_DOT = "packager_pair_dot_8x2_i16i8"
MAX_ROWS, MAX_VECTORS = 4, 3
CONV_ROWS, CONV_VECTORS, REGISTERS = 8, 4, 16    # AVX2's ymm: rows x vectors accumulators, the vectors' panels, a broadcast
SHORT_STEPS, SPILLS = 64, 3                      # k-pair steps of a short reduction; accumulators it may spill


@T.prim_func(s_tir=True)
def _pair_dot_desc(a: T.Buffer((2,), "int16", offset_factor=1), b: T.Buffer((8, 2), "int8", offset_factor=1),
                   c: T.Buffer((8,), "int32", offset_factor=1, scope="local")) -> None:
    with T.sblock("root"):
        T.reads(c[0:8], a[0:2], b[0:8, 0:2])
        T.writes(c[0:8])
        for i in T.serial(0, 8):
            for k in T.serial(0, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")


@T.prim_func(s_tir=True)
def _pair_dot_avx2(a: T.Buffer((2,), "int16", offset_factor=1), b: T.Buffer((8, 2), "int8", offset_factor=1),
                   c: T.Buffer((8,), "int32", offset_factor=1, scope="local")) -> None:
    with T.sblock("root"):
        T.reads(c[0:8], a[0:2], b[0:8, 0:2])
        T.writes(c[0:8])
        pair = T.reinterpret(a.vload([0], "int16x2"), dtype="int32")
        weights = T.cast(b.vload([0, 0], dtype="int8x16"), "int16x16")
        c[T.ramp(T.int32(0), 1, 8)] += T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
            T.reinterpret(T.broadcast(pair, 8), dtype="int16x16"), weights, dtype="int32x8")


TensorIntrin.register(PAIR_DOT, _pair_dot_desc, _pair_dot_avx2, override=True)


def find_int_dot(sch: s_tir.Schedule):
    """The kernel's integer pair dot block (a matmul or convolution: a reduction whose innermost
    iterator is a pair of k, of an int16 operand and an int8 panel operand into int32), None if it
    has none."""
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - a kernel of plain loops (a recurrent layer's): no blocks
        return None
    for b in blocks:
        blk = sch.get(b)
        reduce = [iv for iv in blk.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if len(blk.writes) != 1 or len(reduce) < 2 or not isinstance(reduce[-1].dom.extent, tirx.IntImm):
            continue
        dtypes = sorted(str(r.source.dtype) for r in blk.reads if r.source.name != blk.writes[0].source.name)
        if int(reduce[-1].dom.extent) == 2 and dtypes == ["int16", "int8"] and str(blk.writes[0].source.dtype) == "int32":
            return b
    return None


def _panel(sch: s_tir.Schedule, block) -> tirx.Buffer:
    """The int8 operand: a matmul's [N/L, K/2, L, 2] panels, a convolution's [O/L, KH, KW, C/2, L, 2]."""
    return next(r.source for r in sch.get(block).reads if str(r.source.dtype) == "int8")


def _conv_tile(positions: tuple[int, int], panels: int, steps: int) -> tuple[int, int, int]:
    """(axis, rows, vectors) of a convolution's register tile: rows along the output's x (axis 1)
    or, where that gives more accumulators (a width of 1 to 3), along y (axis 0); the most
    accumulators, then the squarest tile. Over a long reduction (more than SHORT_STEPS k pairs)
    no accumulator may spill: a 7 x 2 tile spilled three to the stack and a 3x3 conv ran 12-17%
    slower than with 4 x 2 or 7 x 1 (Zen 3, 1 thread). Over a short one the tile's write-back
    dominates: 8 x 2 and 7 x 2 beat 4 x 2 / 4 x 3 by 15-25% on 1x1 convs of 16 and 64 channels."""
    budget = REGISTERS + (SPILLS if steps <= SHORT_STEPS else 0)
    vectors = [v for v in range(1, CONV_VECTORS + 1) if panels % v == 0]
    return max(((axis, m, v) for axis in (1, 0) for m in range(1, CONV_ROWS + 1) for v in vectors
                if positions[axis] % m == 0 and m * v + v + 1 <= budget),
               key=lambda t: (t[1] * t[2], min(t[1], t[2]), t[1], t[0]))


def int_dot(rules, func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, KernelSchedule]:
    """The kernel scheduled around its integer matmul or conv (rules: the target's CpuRules), or raise
    RuleMismatch. Producers stay their own stages; consumers are computed per row tile where their
    loops follow the tile's (element-wise epilogues), else each after the matmul, over the whole
    tensor (a reshape or transpose into attention heads)."""
    try:
        sch = s_tir.Schedule(func)
        info = _tiled(rules, sch, per_tile=True)
    except Exception:  # noqa: BLE001 - a consumer that cannot follow the tile (or no fit: raised again below)
        sch = s_tir.Schedule(func)
        info = _tiled(rules, sch, per_tile=False)
    return sch.mod["main"], info


def _epilogue(sch: s_tir.Schedule, tile, after: list) -> list:
    """The blocks after the matmul that read its result (directly or through each other); the
    others (a residual input's dequantize) are inlined into their readers first: reverse_compute_at
    accepts a block that reads nothing of the tile and computes it whole in every tile, into a
    per-task buffer (QDQ BERT's residual adds came out wrong by up to 1.87)."""
    chain = {sch.get(tile).writes[0].source.name}
    epilogue, independent = [], []
    for b in after:
        stmt = sch.get(b)
        if chain & {r.source.name for r in stmt.reads}:
            chain |= {w.source.name for w in stmt.writes}
            epilogue.append(b)
        else:
            independent.append(b)
    for b in independent:
        sch.compute_inline(b)
    return epilogue


def _stages(sch: s_tir.Schedule, tile, epilogue: list) -> list:
    """What runs per tile, as few stages as inlining allows: each epilogue block inlined into its
    reader (one expression per element; a block that writes an output of the kernel stays), then
    the write-back of the int32 tile into the first stage left (it reads the accumulators)."""
    kept = []
    for b in epilogue[:-1]:
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001 - an output of the kernel, or read by two stages
            kept.append(b)
    stages = kept + epilogue[-1:]
    if stages:
        try:
            sch.compute_inline(tile)
            return stages
        except Exception:  # noqa: BLE001 - the tile has several readers: it stays a stage
            pass
    return [tile, *stages]


def _vectorize_stage(sch: s_tir.Schedule, stage, conv: bool) -> None:
    """A per-tile stage vectorized over L lanes: a matmul's columns (contiguous in its output); a
    convolution's positions where the tile has L of them (contiguous NC[H]W stores and residual
    reads), else its channels moved inside the positions (contiguous in the tile, strided stores).
    Chosen for the contiguous stores: timed on 1x1 convs, the two orders differed inside this
    host's run-to-run noise (up to 20%)."""
    *_, first, last = sch.get_loops(stage)          # a conv's (channels, positions), a matmul's (rows, columns)
    channels = conv and loop_extent(sch, last) % INT_LANES != 0
    inner = first if channels else last
    if loop_extent(sch, inner) % INT_LANES:
        return
    outer, lanes = sch.split(inner, [None, INT_LANES])
    if channels:
        sch.reorder(outer, last, lanes)
    sch.vectorize(lanes)


def _axes(sch: s_tir.Schedule, block, conv: int) -> tuple:
    """(lead loops, row loop, column loop, outer reduction loops, pair loop, (rows, vectors) of the
    register tile) of a matmul (conv 0) or a convolution over `conv` spatial axes."""
    if conv == 0:
        *lead, m, n, ko, ki = sch.get_loops(block)
        panels = loop_extent(sch, n) // INT_LANES
        return lead, m, n, [ko], ki, (best_factor(loop_extent(sch, m), MAX_ROWS), best_factor(panels, MAX_VECTORS))
    batch, n, *space = sch.get_loops(block)
    space, ko, ki = space[:conv], space[conv:-1], space[-1]
    y, x = ([None] + space)[-2:]
    steps = math.prod(loop_extent(sch, k) for k in ko)
    axis, mr, nr = _conv_tile((loop_extent(sch, y) if y else 1, loop_extent(sch, x)), loop_extent(sch, n) // INT_LANES,
                              steps)
    lead, m = ([batch, *([y] if y else [])], x) if axis else ([batch, x], y)
    return lead, m, n, ko, ki, (mr, nr)


def _tiled(rules, sch: s_tir.Schedule, per_tile: bool) -> KernelSchedule:
    block = find_int_dot(sch)
    if block is None:
        raise RuleMismatch("no integer pair dot")
    blocks = rules._blocks(sch)
    names = [sch.get(b).name_hint for b in blocks]
    at = names.index(sch.get(block).name_hint)
    producers, consumers = blocks[:at], blocks[at + 1:]
    conv = len(_panel(sch, block).shape) - 4          # spatial axes: a conv1d's 1, a conv2d's 2, a matmul's 0
    lead, m, n, ko, ki, (mr, nr) = _axes(sch, block, conv)
    rows, cols = loop_extent(sch, m), loop_extent(sch, n)
    if int(_panel(sch, block).shape[-2]) != INT_LANES or cols % INT_LANES:
        raise RuleMismatch(f"integer pair dot: not {INT_LANES}-lane panels")
    no, nv = sch.split(n, [None, INT_LANES])
    nob, ni = sch.split(no, [None, nr])
    mo, mi = sch.split(m, [None, mr])
    sch.reorder(*lead, nob, mo, *ko, mi, ni, nv, ki)
    tile = sch.cache_write(block, 0, "local")
    if conv == 2:        # the tile's L channels contiguous, as the pair dot writes them
        sch.transform_layout(block, ("write", 0), lambda b, o, y, x: (b, o // INT_LANES, y, x, o % INT_LANES))
    elif conv == 1:
        sch.transform_layout(block, ("write", 0), lambda b, o, x: (b, o // INT_LANES, x, o % INT_LANES))
    stages = _stages(sch, tile, _epilogue(sch, tile, consumers)) if per_tile else [tile]
    for c in stages:
        sch.reverse_compute_at(c, mo)
    outer = sch.fuse(*lead, nob, mo)
    tasks = loop_extent(sch, outer)
    work = rows * cols * 2 * math.prod(loop_extent(sch, k) for k in ko)
    if work >= PARALLEL_MIN_WORK and tasks > 1:
        sch.parallel(outer)
    for c in stages:
        _vectorize_stage(sch, c, conv > 0)
    if rules.target.arch != "x86_64":
        sch.vectorize(nv)
        sch.unroll(ki)
    sch.unroll(mi)
    sch.unroll(ni)
    init = sch.decompose_reduction(block, ko[0])
    sch.vectorize(sch.get_loops(init)[-1])
    if rules.target.arch == "x86_64":
        sch.tensorize(nv, PAIR_DOT)
    for b in producers + ([] if per_tile else consumers):
        rules._flat_parallel_vector(sch, b)
    return KernelSchedule("int-dot", parallel=tasks if work >= PARALLEL_MIN_WORK else 1, vector=INT_LANES,
                          register_tile=mr * nr, note=("vpmaddwd" if rules.target.arch == "x86_64" else "vectorized")
                          + ("" if per_tile else ", epilogue after the matmul"))
