"""The CPU rule for the integer matmuls of QDQ models (optimize/int8.py makes them):

    C[..., m, n] = sum_k int32(A[..., m, k]) * int32(B[n // L, k // 2, n % L, k % 2])

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
broadcast pair and a panel vector fill AVX2's 16 registers.
"""
from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..tir_util import PARALLEL_MIN_WORK, KernelSchedule, RuleMismatch, best_factor, loop_extent

INT_LANES = 8                  # int32 accumulators per vector: 256-bit registers (AVX2; AVX-512 runs them too)
PAIR_DOT = "packager_pair_dot_8x2_i16i8"
MAX_ROWS, MAX_VECTORS = 4, 3


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


def find_int_matmul(sch: s_tir.Schedule):
    """The kernel's integer pair matmul block (a reduction over k pairs of an int16 operand and
    an int8 panel operand into int32), None if it has none."""
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - a kernel of plain loops (a recurrent layer's): no blocks
        return None
    for b in blocks:
        blk = sch.get(b)
        reduce = [iv for iv in blk.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if len(blk.writes) != 1 or len(reduce) != 2 or not isinstance(reduce[1].dom.extent, tirx.IntImm):
            continue
        dtypes = sorted(str(r.source.dtype) for r in blk.reads if r.source.name != blk.writes[0].source.name)
        if int(reduce[1].dom.extent) == 2 and dtypes == ["int16", "int8"] and str(blk.writes[0].source.dtype) == "int32":
            return b
    return None


def _panel_lanes(sch: s_tir.Schedule, block) -> int:
    """L of the int8 operand's [N/L, K/2, L, 2] panels."""
    panel = next(r.source for r in sch.get(block).reads if str(r.source.dtype) == "int8")
    return int(panel.shape[-2]) if len(panel.shape) == 4 else 0


def int_dot(rules, func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, KernelSchedule]:
    """The kernel scheduled around its integer matmul (rules: the target's CpuRules), or raise
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


def _tiled(rules, sch: s_tir.Schedule, per_tile: bool) -> KernelSchedule:
    block = find_int_matmul(sch)
    if block is None:
        raise RuleMismatch("no integer pair matmul")
    blocks = rules._blocks(sch)
    names = [sch.get(b).name_hint for b in blocks]
    at = names.index(sch.get(block).name_hint)
    producers, consumers = blocks[:at], blocks[at + 1:]
    *lead, m, n, ko, ki = sch.get_loops(block)
    rows, cols = loop_extent(sch, m), loop_extent(sch, n)
    if _panel_lanes(sch, block) != INT_LANES or cols % INT_LANES:
        raise RuleMismatch(f"integer matmul: not {INT_LANES}-lane panels")
    mr, nr = best_factor(rows, MAX_ROWS), best_factor(cols // INT_LANES, MAX_VECTORS)
    no, nv = sch.split(n, [None, INT_LANES])
    nob, ni = sch.split(no, [None, nr])
    mo, mi = sch.split(m, [None, mr])
    sch.reorder(*lead, nob, mo, ko, mi, ni, nv, ki)
    tile = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(tile, mo)
    at_tile = _epilogue(sch, tile, consumers) if per_tile else []
    for c in at_tile:
        sch.reverse_compute_at(c, mo)
    outer = sch.fuse(*lead, nob, mo)
    tasks = loop_extent(sch, outer)
    work = rows * cols * loop_extent(sch, ko) * 2
    if work >= PARALLEL_MIN_WORK and tasks > 1:
        sch.parallel(outer)
    for c in [tile, *at_tile]:
        inner = sch.get_loops(c)[-1]
        if loop_extent(sch, inner) % INT_LANES == 0:
            sch.vectorize(sch.split(inner, [None, INT_LANES])[1])
    if rules.target.arch != "x86_64":
        sch.vectorize(nv)
        sch.unroll(ki)
    sch.unroll(mi)
    sch.unroll(ni)
    init = sch.decompose_reduction(block, ko)
    sch.vectorize(sch.get_loops(init)[-1])
    if rules.target.arch == "x86_64":
        sch.tensorize(nv, PAIR_DOT)
    for b in producers + ([] if per_tile else consumers):
        rules._flat_parallel_vector(sch, b)
    return KernelSchedule("int-dot", parallel=tasks if work >= PARALLEL_MIN_WORK else 1, vector=INT_LANES,
                          register_tile=mr * nr, note=("vpmaddwd" if rules.target.arch == "x86_64" else "vectorized")
                          + ("" if per_tile else ", epilogue after the matmul"))
