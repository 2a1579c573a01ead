"""Rule-based CPU schedules: every kernel parallel and vectorized, no search.

TVM 0.27 ships no CPU schedules for conv or matmul, and untuned TIR is naive single-threaded
loops (about 144x slower than onnxruntime on ResNet-18). These rules are the baseline the
construction-based scheduler (gensor.py) improves on:

* ``tiled-reduction`` (conv, matmul, pooling): the innermost output axis is vectorized, a
  second output axis whose index the vector operand does not use is register-tiled (so each
  vector load is reused across the tile), reductions run inside (a KxK conv's input channels
  innermost, unrolled by 4: reduction_order.py), accumulators live in a small local tile, the
  element-wise epilogue is applied on the way out, and the outer tiles run in parallel.
  Padding stays a separate vectorized stage: inlining it puts a bounds check in the inner loop
  and costs 5x.
* ``vector-row-reduction`` (softmax, layer norm): rows in parallel, each row's sums as vector
  partial sums (rules_reduce.py); ``row-reduction``: TVM's dlight CPU reduction rule, for rows
  that are not whole vectors long.
* ``injective`` (element-wise, reshape, transpose): all loops fused, split into parallel
  chunks and vector lanes; a kernel that selects an input by position (a fused concat, a pad)
  is first cut apart where the selection changes (partition.py).
* ``fallback``: outer loops in parallel, nothing else.
* ``int-dot``: a QDQ model's integer matmul or convolution (int_dot.py: vpmaddwd on x86); it takes no other rule.
* ``winograd-input`` / ``winograd-output``: a Winograd conv's transform kernels, unrolled so their
  constant coefficients fold (winograd.py); they take no other rule.
* ``recurrence``: a recurrent layer's loop kernel, regenerated with vector lanes and a parallel
  matrix-vector product (recurrence.py); it takes no other rule.

Each rule either schedules the whole kernel or raises; the pass falls through to the next
rule, and a kernel no rule fits stays as TVM legalized it (reported as ``naive``).
"""
from __future__ import annotations


from typing import Iterator

import tvm
from tvm import s_tir, tirx

from ....targets import Target
from ...base import PassReport
from . import padding, recurrence, tile_dot, winograd
from .int_dot import find_int_dot, int_dot
from .partition import partition_selects, varies_per_outer
from .reduction_order import contiguous_reduction_last, unroll_contiguous
from .transpose import tile_transposed_copy
from ..tir_util import (PARALLEL_MIN_COPY, PARALLEL_MIN_WORK, Anchor, KernelSchedule, RuleMismatch, best_factor,
                       free_vars, has_if_then_else, index_period, is_reduction, loop_extent, split_last_axis,
                       vector_factor)


def _elements(region) -> int:
    """Elements of the buffer a block region belongs to."""
    n = 1
    for d in region.source.shape:
        n *= int(d)
    return n


class CpuRules:
    """Applies the rules above for one CPU target."""

    def __init__(self, target: Target):
        self.target = target
        self.vector_bits = target.vector_bits
        self.registers = 16 if target.isa == "avx2" else 32

    def lanes(self, dtype_bits: int) -> int:
        return max(self.vector_bits // max(dtype_bits, 8), 1)

    # -- entry -----------------------------------------------------------------------------
    def schedule(self, func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, KernelSchedule]:
        """Apply the first rule that fits; a rule that fails leaves no trace."""
        return next(self.candidates(func))

    def candidates(self, func: tirx.PrimFunc) -> Iterator[tuple[tirx.PrimFunc, KernelSchedule]]:
        """Every rule that fits, in order of preference, then the naive loops (`func` itself)."""
        dot = tile_dot.of(func)
        if dot is not None:                       # a bf16 / int8 conv or matmul: AMX tiles, or its plain loops
            tiled = tile_dot.cpu(func, self.target)
            if tiled is not None:
                yield tiled
            unit = f" (no {dot.k.feature.upper()})"
            yield func, KernelSchedule("naive", note="tile-dot: the plain loops" + ("" if tiled else unit))
            return
        if winograd.stage(func) is not None:     # a Winograd transform: its own schedule, or the plain loops
            try:
                yield winograd.cpu(self, func)
                why = "winograd: the plain loops"
            except Exception as e:  # noqa: BLE001 - schedule primitives raise many error kinds
                why = f"winograd: {str(e).strip().splitlines()[-1][:100] if str(e).strip() else type(e).__name__}"
            yield func, KernelSchedule("naive", note=why)
            return
        looped = recurrence.cpu(func, self.lanes(32))
        if looped is not None:                    # a recurrent loop: regenerated, not scheduled
            yield looped
            yield func, KernelSchedule("naive", note="recurrence: the plain loops")
            return
        if find_int_dot(s_tir.Schedule(func)) is not None:      # an integer matmul or conv: int-dot or nothing
            try:
                yield int_dot(self, func)
                why = "int-dot: the plain loops"
            except Exception as e:  # noqa: BLE001 - schedule primitives raise many error kinds
                why = f"int_dot: {str(e).strip().splitlines()[-1][:100] if str(e).strip() else type(e).__name__}"
            yield func, KernelSchedule("naive", note=why)
            return
        reasons = []
        for rule in (self.tiled_reduction, self.reduction_epilogue, self.row_region, self.column_reduction,
                     self.vector_row_reduction,
                     self.row_reduction, self.partitioned_injective, self.injective, self.fallback):
            sch = s_tir.Schedule(func)
            try:
                info = rule(sch)
            except Exception as e:  # noqa: BLE001 - schedule primitives raise many error kinds
                lines = str(e).strip().splitlines()
                reasons.append(f"{rule.__name__}: {lines[-1][:100] if lines else type(e).__name__}")
                continue
            yield sch.mod["main"], info
        yield func, KernelSchedule("naive", note="; ".join(reasons))

    # -- helpers ---------------------------------------------------------------------------
    def _blocks(self, sch: s_tir.Schedule) -> list:
        return list(sch.get_child_blocks(sch.get_sblock("root")))

    def _blocks_before(self, sch: s_tir.Schedule, name: str | None) -> list:
        blocks = self._blocks(sch)
        names = [sch.get(b).name_hint for b in blocks]
        return blocks[:names.index(name)] if name in names else blocks

    @staticmethod
    def _scatters(sch: s_tir.Schedule, block) -> bool:
        """The block stores at an index computed from its iterators (TVM's layout_transform out of
        channel blocks writes [n, c_o * 8 + c_i, h, w]). dlight's reduction rule computes such a
        producer at its consumer over a wrong region: behind a channel slice it copied 4 of 8
        lanes and the SE block after a padded conv read garbage (ppocrv5_rec, regnety_002)."""
        stmt = sch.get(block)
        return any(not all(isinstance(r.min, (tirx.Var, tirx.IntImm)) for r in w.region) for w in stmt.writes)

    def _dtype_bits(self, sch: s_tir.Schedule, block) -> int:
        writes = sch.get(block).writes
        return writes[0].source.dtype.bits if writes else 32

    def _flat_parallel_vector(self, sch: s_tir.Schedule, block, min_work: int = PARALLEL_MIN_WORK) -> tuple[int, int]:
        """Parallel outer loops x vectorized inner loop for a root-level spatial block.

        With a long innermost axis, vector lanes run along it and the other loops are fused for
        threads (index math stays affine). Otherwise the fewest innermost loops whose extents
        give a vector of at least half the lanes are fused and split into lanes, and the rest
        into parallel chunks: short rows are vectorized too, and a vector never straddles an
        outer index (a channel shuffle's vectors of 58 uint8 over 58x28x28 read across channels,
        gathers: 0.44 ms; over its 28x28 planes, contiguous: 0.08 ms)."""
        loops = sch.get_loops(block)
        if not loops:
            return 1, 1
        lanes = self.lanes(self._dtype_bits(sch, block))
        tiled = tile_transposed_copy(sch, block, lanes, min_work)
        if tiled:
            return tiled
        total = 1
        for lp in loops:
            total *= loop_extent(sch, lp)
        inner_ext = loop_extent(sch, loops[-1])
        if len(loops) > 1 and inner_ext >= lanes:
            vec = vector_factor(inner_ext, lanes)
            if vec < lanes // 2:                     # awkward extent: a predicated tail instead
                vec = lanes
            _, inner = sch.split(loops[-1], [None, vec])
            sch.vectorize(inner)
            outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
            n_outer = loop_extent(sch, outer)
            par = n_outer if total >= min_work and n_outer > 1 else 1
            if par > 1:
                sch.parallel(outer)
            return par, vec
        k, span = len(loops) - 1, inner_ext
        while k > 0 and best_factor(span, lanes) < lanes // 2:
            if span >= lanes and varies_per_outer(sch, block, k):
                break                                # vectors within the plane and a tail, not gathers
            k -= 1
            span *= loop_extent(sch, loops[k])
        fused = sch.fuse(*loops[k:]) if len(loops) - k > 1 else loops[k]
        vec = best_factor(span, lanes) if span >= 4 else 1
        if vec < lanes // 2 and span >= lanes and k > 0:     # the plane's whole vectors, then its tail
            whole, _ = sch.loop_partition(fused, [span - span % lanes, None])
            _, inner = sch.split(whole, [None, lanes])
            sch.vectorize(inner)
            outer = sch.fuse(*loops[:k]) if k > 1 else loops[0]
            n_outer = loop_extent(sch, outer)
            par = n_outer if total >= min_work and n_outer > 1 else 1
            if par > 1:
                sch.parallel(outer)
            return par, lanes
        if vec < 4:
            vec = 1
        par = 1
        if vec > 1:
            outer, inner = sch.split(fused, [None, vec])
            sch.vectorize(inner)
        else:
            outer = fused
        if k > 0:
            outer = sch.fuse(*loops[:k], outer)
        n_outer = total // vec
        if total >= min_work and n_outer > 1:
            chunk = best_factor(n_outer, max(1, n_outer // 256))
            if chunk > 1:
                outer, _ = sch.split(outer, [None, chunk])
            sch.parallel(outer)
            par = n_outer // chunk
        return par, vec

    # -- rule: tiled reduction (conv / matmul / pooling) ----------------------------------
    def prepare_anchor(self, sch: s_tir.Schedule, upto: str | None = None) -> "Anchor":
        """The part every tiling of a one-reduction kernel shares: pad awkward einsum axes, inline
        producers (padding stays a staged block), pick the vector and register-tile axes and
        de-interleave strided inputs. Raises RuleMismatch if the kernel is not of that form.
        With `upto` (a block name), only the blocks before that block are the kernel (the
        reduction-epilogue rule places that block and the ones after it itself)."""
        blocks = self._blocks_before(sch, upto)
        reductions = [b for b in blocks if is_reduction(sch, b)]
        if len(reductions) != 1:
            raise RuleMismatch("needs exactly one reduction block")
        anchor = reductions[0]
        padded = self._pad_awkward_einsum(sch, anchor)
        if padded:                                  # new padding/unpadding blocks around the anchor
            blocks = self._blocks_before(sch, upto)
            anchor = next(b for b in blocks if is_reduction(sch, b))
        pos = [sch.get(b).name_hint for b in blocks].index(sch.get(anchor).name_hint)
        producers, consumers = blocks[:pos], blocks[pos + 1:]

        staged = []                       # producers kept as their own stage (padding)
        for b in producers:
            if has_if_then_else(sch.get(b).body):
                staged.append(b)
            else:
                sch.compute_inline(b)

        blk = sch.get(anchor)
        loops = sch.get_loops(anchor)
        if len(loops) != len(blk.iter_vars):
            raise RuleMismatch("loops and block iterators are not one-to-one")
        iters = list(zip(blk.iter_vars, loops))
        spatial = [(iv, lp) for iv, lp in iters if iv.iter_type == tirx.IterVar.DataPar]
        reduce_ = [(iv, lp) for iv, lp in iters if iv.iter_type == tirx.IterVar.CommReduce]
        if len(spatial) + len(reduce_) != len(iters) or not spatial or not reduce_:
            raise RuleMismatch("unsupported iterator kinds")
        # Loops must be spatial-then-reduce, as legalization emits them.
        if [iv.iter_type for iv, _ in iters] != sorted([iv.iter_type for iv, _ in iters]):
            raise RuleMismatch("reduction loops are not innermost")
        extents = {iv.var: loop_extent(sch, lp) for iv, lp in iters}
        vec, reg = self._pick_axes(blk, spatial, extents)
        reduce_, moved = contiguous_reduction_last(blk, reduce_, vec, extents)
        deinterleaved = self._deinterleave_strided(sch, blk, staged, vec[0].var) if vec else 0
        notes = [f"{deinterleaved} strided input(s) de-interleaved"] if deinterleaved else []
        if padded:
            notes.append(f"padded to {padded}")
        spatial = sorted(spatial, key=lambda s: -self._operand_bytes(blk, s[0].var))
        return Anchor(anchor, staged, consumers, spatial, reduce_, vec, reg, extents,
                      self.lanes(blk.writes[0].source.dtype.bits), "; ".join(notes), contiguous_reduction=moved)

    def finish_anchor(self, sch: s_tir.Schedule, a: "Anchor", outer, vec_inner, unrolled: list,
                      init_depth: int = 1, pad_per_task: bool = False, acc_at=None) -> None:
        """Accumulators in a local tile written back (with the element-wise epilogue) per
        iteration of `outer`, or of `acc_at` (a loop inside it with no reduction loop around it:
        the accumulators are then one register tile); vectorize, unroll, split the reduction's
        init (before the anchor's loop at `init_depth`, the first loop inside `outer`, or right
        inside `acc_at`); staged producers parallel + vectorized, or computed per iteration of
        `outer` (padding.py)."""
        writeback = sch.cache_write(a.block, 0, "local")
        at = outer if acc_at is None else acc_at
        sch.reverse_compute_at(writeback, at)
        for c in a.consumers[:-1]:
            sch.compute_inline(c)
        if a.consumers:
            self._epilogue_at(sch, a, a.consumers[-1], at)
        if acc_at is not None:
            loops = sch.get_loops(a.block)
            init_depth = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(acc_at))) + 1
        wb_inner = sch.get_loops(writeback)[-1]
        if vec_inner is not None and len(sch.get_loops(writeback)) > 1:
            ext, vfac = loop_extent(sch, wb_inner), loop_extent(sch, vec_inner)
            if ext == vfac:
                sch.vectorize(wb_inner)
            elif ext % vfac == 0 and vfac % a.lanes == 0:
                sch.vectorize(sch.split(wb_inner, [None, vfac])[1])
        for lp in unrolled:
            sch.unroll(lp)
        if vec_inner is not None:
            sch.vectorize(vec_inner)
        sch.decompose_reduction(a.block, sch.get_loops(a.block)[init_depth])
        if pad_per_task:
            padding.pad_per_task(sch, a.staged, outer)
            return
        for b in a.staged:
            self._flat_parallel_vector(sch, b, PARALLEL_MIN_COPY)

    def _epilogue_at(self, sch: s_tir.Schedule, a: "Anchor", last, outer) -> None:
        """The element-wise epilogue inlined into the write-back; one that broadcasts the result
        over more elements than the reduction writes (an SE block: x * hardsigmoid(conv(mean x))
        over the whole feature map) runs after the tile's write-back instead, over the tile's
        share of its output: the reduction is computed once, not once per broadcast row (dlight's
        rule recomputed a 240 -> 960 squeeze-excite conv per row, scalar: 3.1 ms for 14x14)."""
        if _elements(sch.get(last).writes[0]) <= _elements(sch.get(a.block).writes[0]):
            sch.reverse_compute_inline(last)
            return
        sch.reverse_compute_at(last, outer)
        inner = sch.get_loops(last)[-1]
        ext = loop_extent(sch, inner)
        if ext % a.lanes == 0:
            sch.vectorize(sch.split(inner, [None, a.lanes])[1] if ext > a.lanes else inner)

    def tiled_reduction(self, sch: s_tir.Schedule) -> KernelSchedule:
        a = self.prepare_anchor(sch)
        vec, reg, extents, lanes = a.vec, a.reg, a.extents, a.lanes
        vfac = vector_factor(extents[vec[0].var], lanes) if vec else 1
        nvec = max(1, -(-vfac // lanes))
        rfac = best_factor(extents[reg[0].var], max(1, (self.registers - 4 - nvec) // nvec)) if reg else 1

        outer, vec_inner, reg_inner = [], None, None
        for iv, lp in a.spatial:
            if vec is not None and iv.same_as(vec[0]) and vfac > 1:
                o, i = sch.split(lp, [None, vfac])
                outer.append(o)
                vec_inner = i
            elif reg is not None and iv.same_as(reg[0]) and rfac > 1:
                o, i = sch.split(lp, [None, rfac])
                outer.append(o)
                reg_inner = i
            else:
                outer.append(lp)
        reduction = self._split_at_periods(sch, a)
        reduction, unrolled = unroll_contiguous(sch, a, reduction)
        sch.reorder(*outer, *reduction, *[x for x in (reg_inner, vec_inner) if x is not None])
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        n_outer = loop_extent(sch, fused)
        par = n_outer if (a.work >= PARALLEL_MIN_WORK and n_outer > 1) else 1
        if par > 1:
            sch.parallel(fused)
        self.finish_anchor(sch, a, fused, vec_inner, unrolled + ([reg_inner] if reg_inner is not None else []))
        return KernelSchedule("tiled-reduction", par, vfac if vec_inner is not None else 1,
                              rfac if reg_inner is not None else 1, note=a.note)

    @staticmethod
    def _split_at_periods(sch: s_tir.Schedule, a: Anchor) -> list:
        """The reduction loops, each split at the period of a reshape folded into an operand's
        index (an out-projection reading the attention's [heads, rows, 64] as [rows, heads*64]
        indexes k // 64 and k % 64 in its innermost loop otherwise: measured 3.3 -> 2.5 ms on
        BERT-base's, against 2.4 ms for the matmul on a contiguous copy)."""
        blk = sch.get(a.block)
        loops = []
        for iv, lp in a.reduce:
            c = index_period(blk, iv.var, a.extents[iv.var])
            loops.extend(sch.split(lp, [None, c]) if c else [lp])
        return loops

    def _pad_awkward_einsum(self, sch: s_tir.Schedule, anchor) -> str:
        """Pad a matmul-like block whose vector or register-tile axis has no good divisor (a
        prime like ViT's 197 or GPT-2's vocabulary) to whole tiles: padded copies in, the real
        region out. Measured 33x on ViT's 197x197 attention scores. Returns what was padded."""
        blk = sch.get(anchor)
        iters = list(blk.iter_vars)
        if any(not isinstance(iv.dom.extent, tirx.IntImm) for iv in iters):
            return ""
        spatial = [(iv, None) for iv in iters if iv.iter_type == tirx.IterVar.DataPar]
        extents = {iv.var: int(iv.dom.extent) for iv in iters}
        vec, reg = self._pick_axes(blk, spatial, extents)
        lanes = self.lanes(blk.writes[0].source.dtype.bits)
        pads = {}
        if vec is not None and extents[vec[0].var] > lanes and extents[vec[0].var] % lanes \
                and best_factor(extents[vec[0].var], lanes) < lanes // 2:
            pads[vec[0].var] = lanes
        if reg is not None and extents[reg[0].var] >= 16 and best_factor(extents[reg[0].var], 16) < 4:
            pads[reg[0].var] = 8
        if not pads:
            return ""
        try:
            sch.pad_einsum(anchor, [pads.get(iv.var, 1) for iv in iters])
        except Exception:  # noqa: BLE001 - not an einsum (conv, pooling): leave it unpadded
            return ""
        return ", ".join(f"{iv.var.name} {extents[iv.var]}->{-(-extents[iv.var] // pads[iv.var]) * pads[iv.var]}"
                         for iv in iters if iv.var in pads)

    @staticmethod
    def _operand_bytes(blk, var) -> int:
        """Size of the largest input the loop over `var` walks through. Sorting the outer loops
        by it (stable) puts the big operand's loops outermost, so each of its tiles is read once
        and reused by the inner loops: GPT-2's 154 MB LM-head weight is streamed once, not once
        per row tile."""
        best = 0
        for r in blk.reads:
            if any(var in free_vars(rg.min) for rg in r.region):
                size = r.source.dtype.bits // 8
                for d in r.source.shape:
                    size *= int(d) if isinstance(d, tirx.IntImm) else 1
                best = max(best, size)
        return best

    @staticmethod
    def _pick_axes(blk, spatial: list, extents: dict) -> tuple:
        """The vector axis (the output's innermost index, so stores are contiguous) and the
        register-tile axis (an output axis that the vector operand's index does not use, so each
        vector load is reused across the tile: output channels for conv, rows for matmul)."""
        last_index_vars = free_vars(blk.writes[0].region[-1].min)
        vec = next((s for s in reversed(spatial) if s[0].var in last_index_vars and extents[s[0].var] > 1), None)
        if vec is None:
            vec = next((s for s in reversed(spatial) if extents[s[0].var] > 1), None)
        if vec is None or len(blk.reads) < 2:
            return vec, None
        dependent = set()
        for r in blk.reads:
            used = set().union(*[free_vars(rg.min) for rg in r.region]) if r.region else set()
            if vec[0].var in used:
                dependent |= used
        candidates = [s for s in spatial if s is not vec and s[0].var not in dependent and extents[s[0].var] > 1]
        return vec, max(candidates, key=lambda s: extents[s[0].var]) if candidates else None

    def _deinterleave_strided(self, sch: s_tir.Schedule, blk, staged: list, vec_var) -> int:
        """Store a staged input (padding) as [..., phase, w // s] when the vector loop reads it with
        stride s, so the kernel's vector loads become contiguous (strided convs, s = 2 in ResNets)."""
        done = 0
        for b in staged:
            buf = sch.get(b).writes[0].source
            for r in blk.reads:
                if not r.source.same_as(buf):
                    continue
                coef = tvm.sym.detect_linear_equation(r.region[-1].min, [vec_var])
                if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm):
                    continue
                stride, width = int(coef[0]), buf.shape[-1]
                if stride < 2 or not isinstance(width, tirx.IntImm) or int(width) % stride:
                    continue
                sch.transform_layout(b, ("write", 0), split_last_axis(stride))
                done += 1
                break
        return done

    # -- rule: a reduction over the anchor's channels as its epilogue (conv -> 1x1 conv) -----
    def reduction_epilogue(self, sch: s_tir.Schedule) -> KernelSchedule:
        from .epilogue import reduction_epilogue

        return reduction_epilogue(self, sch)

    # -- rule: row regions (a matmul reading per-row reductions: softmax @ V) ------------
    def row_region(self, sch: s_tir.Schedule) -> KernelSchedule:
        from .row import row_region

        return row_region(self, sch)

    # -- rule: row reductions (softmax, layer norm) ----------------------------------------
    def column_reduction(self, sch: s_tir.Schedule) -> KernelSchedule:
        from .column import column_reduction

        return column_reduction(self, sch)

    def vector_row_reduction(self, sch: s_tir.Schedule) -> KernelSchedule:
        from .reduce import vector_row_reduction

        return vector_row_reduction(self, sch)

    def row_reduction(self, sch: s_tir.Schedule) -> KernelSchedule:
        from tvm.s_tir.dlight.cpu import Reduction

        if any(self._scatters(sch, b) for b in self._blocks(sch)):
            raise RuleMismatch("a block stores at a computed index (dlight places it wrongly)")
        out = Reduction().apply(sch.mod["main"], tvm.target.Target(self.target.llvm_target()), False)
        if out is None:
            raise RuleMismatch("dlight reduction rule does not apply")
        # dlight builds its own Schedule; replay its trace on ours so `sch` holds the result.
        out.trace.apply_to_schedule(sch, remove_postproc=False)
        return KernelSchedule("row-reduction", note="dlight cpu.Reduction")

    # -- rule: injective --------------------------------------------------------------------
    def _inline_stages(self, sch: s_tir.Schedule) -> list:
        """Every stage but the last inlined where it can be; the blocks left."""
        blocks = self._blocks(sch)
        if any(is_reduction(sch, b) for b in blocks):
            raise RuleMismatch("has a reduction")
        for b in blocks[:-1]:
            try:
                sch.compute_inline(b)
            except Exception:  # noqa: BLE001 - not inlinable: keep it as its own stage
                pass
        return self._blocks(sch)

    def partitioned_injective(self, sch: s_tir.Schedule) -> KernelSchedule:
        """An injective kernel that selects an input by position, cut apart there (partition.py)."""
        left = self._inline_stages(sch)
        cut = partition_selects(sch, left[0], self.lanes(self._dtype_bits(sch, left[0])),
                                PARALLEL_MIN_WORK) if len(left) == 1 else None
        if cut is None:
            raise RuleMismatch("no select by position in one stage")
        return KernelSchedule("injective", cut[0], cut[1], parts=cut[2])

    def injective(self, sch: s_tir.Schedule) -> KernelSchedule:
        par, vec = 1, 1
        for b in self._inline_stages(sch):
            p, v = self._flat_parallel_vector(sch, b)
            par, vec = max(par, p), max(vec, v)
        return KernelSchedule("injective", par, vec)

    # -- rule: fallback ---------------------------------------------------------------------
    def fallback(self, sch: s_tir.Schedule) -> KernelSchedule:
        par = 1
        for b in self._blocks(sch):
            loops = sch.get_loops(b)
            blk = sch.get(b)
            lead = []
            for lp, iv in zip(loops, blk.iter_vars):
                if iv.iter_type != tirx.IterVar.DataPar:
                    break
                lead.append(lp)
            if not lead:
                continue
            fused = sch.fuse(*lead) if len(lead) > 1 else lead[0]
            n = loop_extent(sch, fused)
            if n > 1:
                sch.parallel(fused)
                par = max(par, n)
        if par == 1:
            raise RuleMismatch("nothing to parallelize")
        return KernelSchedule("fallback", par)


def schedule_kernels(kernels: dict[str, tirx.PrimFunc], target: Target
                     ) -> tuple[dict[str, tirx.PrimFunc], PassReport]:
    """The `schedule` pass for a CPU target: one rule-based schedule per kernel."""
    rules = CpuRules(target)
    out, per_kernel, counts = {}, {}, {}
    for name, func in kernels.items():
        out[name], info = rules.schedule(func)
        per_kernel[name] = info.summary() + (f" ({info.note})" if info.rule == "naive" else "")
        counts[info.rule] = counts.get(info.rule, 0) + 1
    naive = counts.get("naive", 0)
    summary = f"{len(kernels)} kernels: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
    if naive:
        summary += f" ({naive} left unscheduled)"
    return out, PassReport("schedule", "applied", summary, {"rules": counts, "kernels": per_kernel})
