"""The CPU rule for the integer matmuls and convolutions of QDQ models (optimize/int8.py makes
them), in one of two forms (`IntDot`: L lanes of int32 sums, G products each):

    C[..., m, n] = sum_k int32(A[..., m, k]) * int32(B[n // L, k // G, n % L, k % G])
    C[b, o, y, x] = sum_(ky, kx, k) int32(A[b, y*s + ky*d, x*s + kx*d, k]) * int32(B[o // L, ky, kx, k // G, o % L, k % G])
    (and the same over x alone: a conv1d)

* PAIR (L 8, G 2): A is int16 (a quantized activation minus its zero point). On x86 the step over
  8 lanes x 2 k is one `vpmaddwd` (llvm.x86.avx2.pmadd.wd: sixteen 16-bit products summed in pairs
  into eight int32, no saturation) on a broadcast activation pair and the panel's sign-extended
  weights. Elsewhere (arm64) the same loops are vectorized by LLVM.
* QUAD (L 16, G 4; AVX-512 VNNI): A is uint8 (the quantized activation itself, offset to unsigned;
  the int8 pass subtracts its zero point's share from the sums). The step over 16 lanes x 4 k is
  one `vpdpbusd` on a zmm register: 64 u8 x s8 products summed in fours into sixteen int32 and
  added to them (no saturation: VPDPBUSDS is the saturating one). 4x the products of a
  `vpmaddwd` on ymm, and no separate add.

Both are exact; each is a TensorIntrin below, tensorized.

    parallel for (batch, column panels of nr vectors, row tiles of mr rows)
      for k groups: for mr rows: for nr vectors: C_tile[row, vector] += dot(A group, B panel)
      write the tile back through the element-wise epilogue (scale, bias, activation, requantize)

Column panels run outside the row tiles so a panel (K x nr*L int8) stays in L1 while every row
passes it. mr and nr divide M and N/L (tensorize takes no tail); the accumulators plus the
panel's vectors and a broadcast fit the registers (AVX2's 16 ymm for PAIR; AVX-512's 32 zmm for
QUAD). A convolution is the same loops with output positions along x (or y, for a map 1-3 wide)
as rows and output channels as columns; its int32 tile is laid out [channel panel][position][L]
so each vector of L channels is contiguous.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..tir_util import PARALLEL_MIN_WORK, KernelSchedule, RuleMismatch, best_factor, loop_extent


class IntDot(NamedTuple):
    """The integer dot product a target's int-dot rule computes in one instruction: `lanes` int32
    sums, each adding `group` products of an 8-bit weight and an activation of type `activation`
    ("int16": x_q minus its zero point; "uint8": x_q offset to unsigned, its zero point
    subtracted from the sums). The int8 pass packs weights as [N/lanes, K/group, lanes, group]."""

    lanes: int
    group: int
    activation: str


PAIR = IntDot(8, 2, "int16")
QUAD = IntDot(16, 4, "uint8")
TILE = IntDot(16, 64, "uint8")     # AMX-INT8: 16 int32 per tile row, each adding 64 products (rules/tile_dot.py)
INTRINSICS = {PAIR: "packager_pair_dot_8x2_i16i8", QUAD: "packager_quad_dot_16x4_u8i8"}
INSTRUCTION = {PAIR: "vpmaddwd", QUAD: "vpdpbusd"}
# per form: registers, a matmul's most rows and vectors, a conv tile's most rows and vectors
TILES = {PAIR: (16, 4, 3, 8, 4), QUAD: (32, 8, 3, 16, 4)}
SHORT_STEPS, SPILLS = 64, 3                      # k-group steps of a short reduction; accumulators it may spill


def integer_dots(target) -> tuple[IntDot, ...]:
    """The forms a CPU target computes, preferred first: TILE where LLVM may emit AMX-INT8 (a named
    CPU that has it, or the mattr; its kernels are TileDots, not this rule's), QUAD where it may
    emit AVX-512 VNNI (`+avx512vnni` from the build host or the x86-avx512-vnni row, or a named
    CPU that has it), PAIR everywhere (vpmaddwd on x86, vectorized loops on arm64)."""
    tiles = (TILE,) if target.arch == "x86_64" and "amx-int8" in target.llvm_features else ()
    if target.arch == "x86_64" and target.vector_bits >= 512 and "avx512vnni" in target.llvm_features:
        return (*tiles, QUAD, PAIR)
    return (*tiles, PAIR)


def _dot_desc(form: IntDot):
    """What a form's instruction computes: `lanes` int32 sums, each adding `group` products."""
    lanes, group, activation = form

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((group,), activation, offset_factor=1), b: T.Buffer((lanes, group), "int8", offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:group], b[0:lanes, 0:group])
            T.writes(c[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, group):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")
    return desc


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


@T.prim_func(s_tir=True)
def _quad_dot_vnni(a: T.Buffer((4,), "uint8", offset_factor=1), b: T.Buffer((16, 4), "int8", offset_factor=1),
                   c: T.Buffer((16,), "int32", offset_factor=1, scope="local")) -> None:
    # LLVM 22's vpdpbusd takes its 64 bytes as <64 x i8> (older LLVMs: <16 x i32>, as TVM's own intrinsic)
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        quad = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
        c[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), c.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(quad, 16), dtype="uint8x64"), b.vload([0, 0], dtype="int8x64"), dtype="int32x16")


TensorIntrin.register(INTRINSICS[PAIR], _dot_desc(PAIR), _pair_dot_avx2, override=True)
TensorIntrin.register(INTRINSICS[QUAD], _dot_desc(QUAD), _quad_dot_vnni, override=True)


def find_int_dot(sch: s_tir.Schedule):
    """The kernel's integer dot block (a matmul or convolution: a reduction whose innermost
    iterator is a group of k, of a PAIR or QUAD activation and an int8 panel operand into int32),
    None if it has none."""
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
        group = int(reduce[-1].dom.extent)
        if str(blk.writes[0].source.dtype) == "int32" and any(
                group == f.group and dtypes == sorted([f.activation, "int8"]) for f in INTRINSICS):
            return b
    return None


def _panel(sch: s_tir.Schedule, block) -> tirx.Buffer:
    """The int8 operand: a matmul's [N/L, K/G, L, G] panels, a convolution's [O/L, KH, KW, C/G, L, G]."""
    return next(r.source for r in sch.get(block).reads if str(r.source.dtype) == "int8")


def _form(sch: s_tir.Schedule, block) -> IntDot:
    """The block's form, read off its panel's innermost (lanes, group)."""
    lanes, group = (int(d) for d in _panel(sch, block).shape[-2:])
    form = next((f for f in INTRINSICS if (f.lanes, f.group) == (lanes, group)), None)
    if form is None:
        raise RuleMismatch(f"integer dot: no form of {lanes} lanes x {group}")
    return form


def _conv_tile(positions: tuple[int, int], panels: int, steps: int, form: IntDot = PAIR) -> tuple[int, int, int]:
    """(axis, rows, vectors) of a convolution's register tile: rows along the output's x (axis 1)
    or, where that gives more accumulators (a width of 1 to 3), along y (axis 0); the most
    accumulators, then the squarest tile. Over a long reduction (more than SHORT_STEPS k groups)
    no accumulator may spill: a 7 x 2 tile spilled three to the stack and a 3x3 conv ran 12-17%
    slower than with 4 x 2 or 7 x 1 (Zen 3, 1 thread, PAIR). Over a short one the tile's write-back
    dominates: 8 x 2 and 7 x 2 beat 4 x 2 / 4 x 3 by 15-25% on 1x1 convs of 16 and 64 channels."""
    registers, _, _, max_rows, max_vectors = TILES[form]
    budget = registers + (SPILLS if steps <= SHORT_STEPS else 0)
    vectors = [v for v in range(1, max_vectors + 1) if panels % v == 0]
    tiles = [(axis, m, v) for axis in (1, 0) for m in range(1, max_rows + 1) for v in vectors
             if positions[axis] % m == 0 and m * v + v + 1 <= budget]
    if form == QUAD:        # the most positions: 14 x 2 ran 5-20% faster than 7 x 4 (Xeon, 1x1 and 3x3 at 56x56)
        return max(tiles, key=lambda t: (t[1] * t[2], t[1], t[0]))
    return max(tiles, key=lambda t: (t[1] * t[2], min(t[1], t[2]), t[1], t[0]))


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


def _vectorize_stage(sch: s_tir.Schedule, stage, conv: bool, form: IntDot) -> None:
    """A per-tile stage vectorized: a matmul's columns by the form's lanes (contiguous in its
    output); a convolution's positions where the tile has 8 of them (contiguous NC[H]W stores and
    residual reads; QUAD: all of the tile's positions, 4 or more), else its channels moved inside
    the positions (contiguous in the tile, strided stores). Chosen for the contiguous stores: timed
    on 1x1 convs (PAIR), the two orders differed inside this host's run-to-run noise (up to 20%)."""
    *_, first, last = sch.get_loops(stage)          # a conv's (channels, positions), a matmul's (rows, columns)
    positions = loop_extent(sch, last)
    if conv and form == QUAD and positions % 8 and positions >= 4:
        sch.vectorize(last)
        return
    channels = conv and positions % 8 != 0
    inner, width = (first, form.lanes) if channels else (last, 8 if conv else form.lanes)
    if loop_extent(sch, inner) % width:
        return
    outer, lanes = sch.split(inner, [None, width])
    if channels:
        sch.reorder(outer, last, lanes)
    sch.vectorize(lanes)


def _axes(sch: s_tir.Schedule, block, conv: int, form: IntDot) -> tuple:
    """(lead loops, row loop, column loop, outer reduction loops, group loop, (rows, vectors) of the
    register tile) of a matmul (conv 0) or a convolution over `conv` spatial axes."""
    if conv == 0:
        *lead, m, n, ko, ki = sch.get_loops(block)
        panels = loop_extent(sch, n) // form.lanes
        _, rows, vectors, _, _ = TILES[form]
        return lead, m, n, [ko], ki, (best_factor(loop_extent(sch, m), rows), best_factor(panels, vectors))
    batch, n, *space = sch.get_loops(block)
    space, ko, ki = space[:conv], space[conv:-1], space[-1]
    y, x = ([None] + space)[-2:]
    steps = math.prod(loop_extent(sch, k) for k in ko)
    axis, mr, nr = _conv_tile((loop_extent(sch, y) if y else 1, loop_extent(sch, x)), loop_extent(sch, n) // form.lanes,
                              steps, form)
    lead, m = ([batch, *([y] if y else [])], x) if axis else ([batch, x], y)
    return lead, m, n, ko, ki, (mr, nr)


def _tiled(rules, sch: s_tir.Schedule, per_tile: bool) -> KernelSchedule:
    block = find_int_dot(sch)
    if block is None:
        raise RuleMismatch("no integer dot")
    form = _form(sch, block)
    x86 = rules.target.arch == "x86_64"
    if form not in integer_dots(rules.target):
        raise RuleMismatch(f"integer dot: {INSTRUCTION[form]} not on target {rules.target.name}")
    blocks = rules._blocks(sch)
    names = [sch.get(b).name_hint for b in blocks]
    at = names.index(sch.get(block).name_hint)
    producers, consumers = blocks[:at], blocks[at + 1:]
    conv = len(_panel(sch, block).shape) - 4          # spatial axes: a conv1d's 1, a conv2d's 2, a matmul's 0
    lead, m, n, ko, ki, (mr, nr) = _axes(sch, block, conv, form)
    rows, cols, lanes = loop_extent(sch, m), loop_extent(sch, n), form.lanes
    no, nv = sch.split(n, [None, lanes])
    nob, ni = sch.split(no, [None, nr])
    mo, mi = sch.split(m, [None, mr])
    sch.reorder(*lead, nob, mo, *ko, mi, ni, nv, ki)
    tile = sch.cache_write(block, 0, "local")
    if conv == 2:        # the tile's L channels contiguous, as the dot writes them
        sch.transform_layout(block, ("write", 0), lambda b, o, y, x: (b, o // lanes, y, x, o % lanes))
    elif conv == 1:
        sch.transform_layout(block, ("write", 0), lambda b, o, x: (b, o // lanes, x, o % lanes))
    stages = _stages(sch, tile, _epilogue(sch, tile, consumers)) if per_tile else [tile]
    for c in stages:
        sch.reverse_compute_at(c, mo)
    outer = sch.fuse(*lead, nob, mo)
    tasks = loop_extent(sch, outer)
    work = rows * cols * form.group * math.prod(loop_extent(sch, k) for k in ko)
    if work >= PARALLEL_MIN_WORK and tasks > 1:
        sch.parallel(outer)
    for c in stages:
        _vectorize_stage(sch, c, conv > 0, form)
    if not x86:
        sch.vectorize(nv)
        sch.unroll(ki)
    sch.unroll(mi)
    sch.unroll(ni)
    init = sch.decompose_reduction(block, ko[0])
    sch.vectorize(sch.get_loops(init)[-1])
    if x86:
        sch.tensorize(nv, INTRINSICS[form])
    for b in producers + ([] if per_tile else consumers):
        rules._flat_parallel_vector(sch, b)
    return KernelSchedule("int-dot", parallel=tasks if work >= PARALLEL_MIN_WORK else 1, vector=lanes,
                          register_tile=mr * nr, note=(INSTRUCTION[form] if x86 else "vectorized")
                          + ("" if per_tile else ", epilogue after the matmul"))
