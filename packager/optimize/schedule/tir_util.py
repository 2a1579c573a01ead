"""TIR helpers the schedules share (rule-based CPU and GPU, Gensor's CPU and GPU lowering): loop
extents, factor choices, block kinds, and the records a schedule leaves for the report."""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import expr as ir
from tvm.sym.analyzer import ProofStrength

# Below this many loop iterations a kernel runs on one thread: a parallel launch costs more.
PARALLEL_MIN_WORK = 1 << 16
# Padding stages inside conv kernels are pure copies but serialize the kernel (Amdahl): split
# them across threads from a lower size.
PARALLEL_MIN_COPY = 1 << 13
SYMBOLIC = ProofStrength.SYMBOLIC_BOUND


@dataclass
class KernelSchedule:
    """What the pass did to one kernel (for the build report)."""

    rule: str
    parallel: int = 1              # extent of the parallel loop (1: serial)
    vector: int = 1                # lanes of the innermost vectorized loop
    register_tile: int = 1         # extent of the unrolled register-tile loop
    note: str = ""
    parts: int = 1                 # loops cut where a select changes its answer (rules/partition.py)

    def summary(self) -> str:
        parts = [self.rule]
        if self.parallel > 1:
            parts.append(f"parallel {self.parallel}")
        if self.vector > 1:
            parts.append(f"vector {self.vector}")
        if self.register_tile > 1:
            parts.append(f"regtile {self.register_tile}")
        if self.parts > 1:
            parts.append(f"{self.parts} parts at its selects")
        return ", ".join(parts)


@dataclass
class Anchor:
    """A one-reduction kernel prepared for tiling (see CpuRules.prepare_anchor)."""

    block: object                  # the reduction block (conv, matmul, pooling)
    staged: list                   # producer blocks kept as their own stage (padding)
    consumers: list                # element-wise epilogue blocks
    spatial: list                  # (iter var, loop), big-operand loops first
    reduce: list                   # (iter var, loop)
    vec: tuple | None              # (iter var, loop) of the vector axis
    reg: tuple | None              # (iter var, loop) of the rule's register-tile axis
    extents: dict                  # iter var -> extent
    lanes: int
    note: str = ""
    contiguous_reduction: bool = False   # the last reduce iterator was moved innermost (a KxK conv's channels)

    @property
    def work(self) -> int:
        n = 1
        for e in self.extents.values():
            n *= e
        return n


class RuleMismatch(Exception):
    """The rule does not apply to this kernel."""


def free_vars(expr) -> set:
    found: set = set()
    tvm_ffi.structural_walk(expr, (tirx.Var, found.add), order="post")
    return found


def has_if_then_else(stmt) -> bool:
    hit: list = []

    def visit(call):
        if getattr(call.op, "name", "").endswith("if_then_else"):
            hit.append(call)

    tvm_ffi.structural_walk(stmt, (ir.Call, visit), order="post")
    return bool(hit)


def index_period(block, var, extent: int) -> int:
    """The divisor c of a folded reshape in the block's read indices (`(k) // c`, `(k) % c`
    with c dividing the loop's extent): splitting the loop over `var` by c turns them into the
    two loop variables, so the inner loop addresses operands without integer division. 0 if none."""
    found: list[int] = []

    def visit(node):
        c = node.b
        if isinstance(c, tirx.IntImm) and 1 < int(c) < extent and extent % int(c) == 0 and var in free_vars(node.a):
            found.append(int(c))

    for r in block.reads:
        for rg in r.region:
            tvm_ffi.structural_walk(rg.min, (tirx.FloorDiv, visit), order="post")
            tvm_ffi.structural_walk(rg.min, (tirx.FloorMod, visit), order="post")
    return min(found) if found else 0


def loop_extent(sch: s_tir.Schedule, loop) -> int:
    ext = sch.get(loop).extent
    if not isinstance(ext, tirx.IntImm):
        raise RuleMismatch("symbolic loop extent")
    return int(ext)


def best_factor(n: int, cap: int, multiple: int = 1) -> int:
    """Largest divisor of n that is <= cap, preferring multiples of `multiple`."""
    divisors = [d for d in range(1, min(n, cap) + 1) if n % d == 0]
    aligned = [d for d in divisors if d % multiple == 0]
    return max(aligned or divisors)


def vector_factor(n: int, lanes: int) -> int:
    """Vector loop length for an axis of extent n: whole vectors (one or two registers) when they
    divide n, else the largest divisor that fits one register, else (a prime-like extent) one
    register with a predicated tail. Odd lengths like 28 or 29 lanes make LLVM split and
    shuffle vectors (9x slower measured on a ResNet conv)."""
    for d in (2 * lanes, lanes):
        if n % d == 0:
            return d
    best = best_factor(n, lanes)
    return best if best >= lanes // 2 or n < lanes else lanes


def split_last_axis(stride: int):
    """Index map (..., w) -> (..., w % stride, w // stride); the stride is closed over because
    transform_layout treats every lambda parameter as an index."""
    return lambda *i: (*i[:-1], i[-1] % stride, i[-1] // stride)


def is_reduction(sch: s_tir.Schedule, block) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vector lanes along an element-wise block's innermost loop when they divide it (a
    reduction block is left alone)."""
    if is_reduction(sch, block):
        return
    loops = sch.get_loops(block)
    ext = loop_extent(sch, loops[-1])
    if ext % lanes == 0 and ext >= lanes:
        sch.vectorize(sch.split(loops[-1], [None, lanes])[1] if ext > lanes else loops[-1])


# The lowering steps up to buffer compaction: after them every shared buffer has the size the
# CUDA source will declare (the region its block touches, as TVM bounds it).
_COMPACT = (s_tir.transform.LowerCrossThreadReduction, s_tir.transform.LowerInitBlock,
            s_tir.transform.PlanAndUpdateBufferAllocationLocation, s_tir.transform.ConvertBlocksToOpaque,
            s_tir.transform.CompactBufferAllocation, s_tir.transform.LowerOpaqueBlock)


def gpu_kernel_fault(func: tirx.PrimFunc, max_shared: int) -> str | None:
    """What makes a scheduled GPU kernel unfit to ship, or None. Both checks run on the compacted
    form, where every buffer has the size the CUDA source will declare:
    * a store to a shared or local buffer whose index cannot be proven inside the buffer, given
      the thread and loop extents and the guards around it (TVM's OOBChecker ignores guards and
      flagged every kernel of a squeezenet): dlight's GEMV rule, for an 8-row product in a
      32x16 block, lets all 16 rows of threads write an 8-element shared buffer
      (compute-sanitizer found it on an H200; the outputs were right by luck);
    * more static shared memory per device kernel (blockIdx launch) than `max_shared`: a
      schedule sizes its tiles from loop extents, but TVM bounds index arithmetic loosely (a
      grouped conv's `ff // 68 * 68 + rc` over a 2-channel tile is bounded to 3 groups of 68),
      and ptxas then refuses the whole package."""
    mod = tvm.transform.Sequential([p() for p in _COMPACT])(tvm.IRModule({"main": func}))
    try:
        stray = _stray_write(mod["main"].body, tvm.sym.Analyzer())
    except Exception:  # noqa: BLE001 - a form the walk cannot bind: the schedule is taken as before
        stray = None
    if stray:
        return stray
    worst = 0

    def kernel(node: tirx.stmt.AttrStmt) -> None:
        nonlocal worst
        if node.attr_key == "thread_extent" and str(node.node.thread_tag).startswith("blockIdx"):
            worst = max(worst, _shared_bytes(node.body))

    tvm_ffi.structural_walk(mod["main"].body, (tirx.stmt.AttrStmt, kernel), order="post")
    if worst <= max_shared:
        return None
    return f"{worst} bytes of shared memory per block after buffer compaction (limit {max_shared})"


def _stray_write(stmt, ana) -> str | None:
    """The first store to a shared or local buffer that cannot be proven in bounds, or None."""
    if isinstance(stmt, tirx.stmt.SeqStmt):
        return next((r for r in (_stray_write(x, ana) for x in stmt.seq) if r), None)
    if isinstance(stmt, tirx.stmt.For):
        ana.bind(stmt.loop_var, tvm.ir.Range.from_min_extent(stmt.min, stmt.extent))
        return _stray_write(stmt.body, ana)
    if isinstance(stmt, tirx.stmt.AttrStmt):
        if stmt.attr_key == "thread_extent":
            ana.bind(stmt.node.var, tvm.ir.Range.from_min_extent(0, stmt.value))
        return _stray_write(stmt.body, ana)
    if isinstance(stmt, tirx.stmt.Bind):
        ana.bind(stmt.var, stmt.value)
        return None
    if isinstance(stmt, tirx.stmt.IfThenElse):
        with ana.constraint_scope(stmt.condition):
            hit = _stray_write(stmt.then_case, ana)
        if hit or stmt.else_case is None:
            return hit
        with ana.constraint_scope(tirx.Not(stmt.condition)):
            return _stray_write(stmt.else_case, ana)
    if isinstance(stmt, (tirx.stmt.While, tirx.stmt.DeclBuffer)) and getattr(stmt, "body", None) is not None:
        return _stray_write(stmt.body, ana)
    if isinstance(stmt, tirx.stmt.BufferStore) and stmt.buffer.scope() in ("shared", "local"):
        for k, (i, n) in enumerate(zip(stmt.indices, stmt.buffer.shape)):
            i = ana.canonical_simplify(i)          # compaction writes `base + k - base`
            # SYMBOLIC_BOUND lets the analyzer's Z3 fallback carry a guard on a fused index
            # (`f < 45`) through the division that unfuses it (`f // 9 < 5`)
            if not (ana.can_prove(i >= 0, SYMBOLIC) and ana.can_prove(i < n, SYMBOLIC)):
                lo_hi = ana.const_int_bound(i)
                return (f"a write to {stmt.buffer.name} can leave it (dimension {k}: index in "
                        f"[{lo_hi.min_value}, {lo_hi.max_value}], extent {n})")
    return None


def _shared_bytes(stmt) -> int:
    sizes: list[int] = []

    def visit(node: tirx.stmt.AllocBuffer) -> None:
        b = node.buffer
        if b.scope() == "shared" and all(isinstance(x, tirx.IntImm) for x in b.shape):
            sizes.append(math.prod(int(x) for x in b.shape) * max(b.dtype.bits // 8, 1))

    tvm_ffi.structural_walk(stmt, (tirx.stmt.AllocBuffer, visit), order="post")
    return sum(sizes)


def unbound_blocks(func: tirx.PrimFunc) -> list[str]:
    """Blocks of a scheduled PrimFunc that sit under no blockIdx/threadIdx loop: TVM would leave
    them in the host function (e.g. dlight's Transpose rule schedules only the transpose block of
    a fused kernel), which a GPU package cannot run."""
    stack: list[tuple[int, bool]] = []            # (indent, is a thread-binding loop)
    unbound = []
    for line in func.script().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if text.startswith("with T.sblock(") and '"root"' not in text and not any(b for _, b in stack):
            unbound.append(text.split('"')[1] if '"' in text else text)
        stack.append((indent, "T.thread_binding(" in text))
    return unbound
