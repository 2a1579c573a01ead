"""ETO's bridge operators (Section 6.2, Definition 5) for the level-3 tuner's reuse tree.

Two kernels of one sketch whose extents cross (one loop larger, another smaller: ResNet's 1x1
convs with 4x the channels of the 3x3 ones next to them) cannot reuse each other's programs.
Their bridge is a kernel of the same sketch at the elementwise minimum of their extents, which
both dominate: it is tuned (never deployed) and both reuse its program.

* Candidates: the 1-hop bridge of every same-sketch pair that is not reusable, unless a kernel
  of the graph has those extents already (ETO adds 1-hop bridges only).
* Selection: a directed Steiner tree over the kernels (terminals) with the bridges as optional
  nodes. The greedy form used here: add the bridge that lowers the minimum-cost arborescence's
  cost most, as long as one does (each bridge pays its own tuning, from scratch or by reuse),
  then drop a chosen bridge nothing reuses.
* The kernel: the source kernel's anchor (after the rules' preparation: what its workload is
  read from) as a multiply-accumulate of its two reads with the same index expressions over the
  smaller iteration space, each buffer as large as those indices reach. It is kept only when its
  workload has the source's sketch and the bridge's extents (the rules pick the same vector
  iterator, no index step changes); padding and de-interleaving stages are not copied, as ETO's
  bridges take default non-loop parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, te, tirx
from tvm.ir.expr import TensorLoad   # TVM 0.27's BufferLoad

from .reuse import reusable, reuse_tree, sketch_of

Nodes = dict[str, tuple[str, tuple[int, ...]]]      # kernel -> (sketch, extents)


@dataclass(frozen=True)
class Bridge:
    name: str
    sketch: str
    extents: tuple[int, ...]
    between: tuple[str, str]            # the two kernels it was made for (any source of its sketch builds it)


def bridge_name(extents: tuple[int, ...]) -> str:
    return "bridge[" + ",".join(map(str, extents)) + "]"


def candidates(nodes: Nodes, refused: set | frozenset = frozenset()) -> list[Bridge]:
    """1-hop bridges: the elementwise minimum of each same-sketch pair that does not reuse either
    way (not those in `refused`: (sketch, extents) whose kernel could not be built)."""
    names = sorted(nodes)
    taken = {(sk, ext) for sk, ext in nodes.values()}
    found: dict[tuple[str, tuple[int, ...]], Bridge] = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (sk_a, ext_a), (sk_b, ext_b) = nodes[a], nodes[b]
            if sk_a != sk_b or reusable(ext_a, ext_b):
                continue
            ext = tuple(min(x, y) for x, y in zip(ext_a, ext_b))
            if (sk_a, ext) not in taken | found.keys() and (sk_a, ext) not in refused:
                found[(sk_a, ext)] = Bridge(bridge_name(ext), sk_a, ext, (a, b))
    return sorted(found.values(), key=lambda br: (br.sketch, br.extents))


def choose(nodes: Nodes, scratch: float, reuse: float, root_cost: dict[str, float] | None = None,
           refused: set | frozenset = frozenset()) -> tuple[dict[str, str | None], list[Bridge]]:
    """(kernel or bridge -> its reuse parent, the bridges chosen): the greedy directed Steiner
    tree. A bridge is worth its cost only where it joins kernels that no reuse chain joins yet,
    so only those are tried."""
    chosen: list[Bridge] = []
    parents, cost = reuse_tree(nodes, scratch, reuse, root_cost)
    pool = candidates(nodes, refused)
    while pool:
        joined = _components(nodes, chosen)
        useful = [br for br in pool if joined[br.between[0]] != joined[br.between[1]]]
        tried = [(reuse_tree(_with(nodes, chosen + [br]), scratch, reuse, root_cost), br) for br in useful]
        best = min(tried, key=lambda x: (x[0][1], x[1].extents), default=None)
        if best is None or best[0][1] >= cost - 1e-9:
            break
        (parents, cost), br = best
        chosen.append(br)
        pool.remove(br)
    while True:                                          # a bridge nothing reuses only costs
        idle = [br for br in chosen if br.name not in {p for p in parents.values() if p}]
        if not idle:
            return parents, chosen
        chosen = [br for br in chosen if br not in idle]
        parents, cost = reuse_tree(_with(nodes, chosen), scratch, reuse, root_cost)


def _with(nodes: Nodes, bridges: list[Bridge]) -> Nodes:
    return {**nodes, **{br.name: (br.sketch, br.extents) for br in bridges}}


def _components(nodes: Nodes, bridges: list[Bridge]) -> dict[str, int]:
    """Node -> its group of nodes joined by reuse chains (a bridge joins what it is reusable with)."""
    import networkx as nx

    everything = _with(nodes, bridges)
    names = list(everything)
    g = nx.Graph()
    g.add_nodes_from(names)
    g.add_edges_from((a, b) for i, a in enumerate(names) for b in names[i + 1:]
                     if everything[a][0] == everything[b][0] and reusable(everything[a][1], everything[b][1]))
    group = {n: i for i, part in enumerate(nx.connected_components(g)) for n in part}
    return {n: group[n] for n in nodes}


def bridge_kernel(func: tirx.PrimFunc, rules, extents: tuple[int, ...]) -> tirx.PrimFunc | None:
    """`func`'s anchor as a multiply-accumulate over `extents` (module docstring); None when the
    anchor is not `out += a * b` over buffer reads with integer index expressions."""
    sch = s_tir.Schedule(func)
    blk = sch.get(rules.prepare_anchor(sch).block)
    store, ivs = blk.body, list(blk.iter_vars)
    if not isinstance(store, tirx.BufferStore) or len(extents) != len(ivs):
        return None
    reads = _product_reads(store)
    spatial = [d for d, iv in enumerate(ivs) if iv.iter_type == tirx.IterVar.DataPar]
    if reads is None or [_iterator_of(i, ivs) for i in store.indices] != spatial:   # out[i, j, ...] in order
        return None
    domain = {iv.var: e for iv, e in zip(ivs, extents)}
    shapes = [_reach(load.indices, domain) for load in reads]
    if any(s is None for s in shapes):
        return None
    ins = [te.placeholder(shape, load.source.dtype, name=load.source.name) for load, shape in zip(reads, shapes)]
    raxes = [te.reduce_axis((0, extents[d]), name=ivs[d].var.name) for d in range(len(ivs)) if d not in spatial]

    def body(*space):
        env = dict(zip([ivs[d].var for d in spatial], space)) | dict(
            zip([ivs[d].var for d in range(len(ivs)) if d not in spatial], raxes))
        a, b = ([_rebuild(i, env) for i in load.indices] for load in reads)
        return te.sum(ins[0][tuple(a)] * ins[1][tuple(b)], axis=raxes)
    try:
        out = te.compute(tuple(extents[d] for d in spatial), body, name=store.buffer.name)
    except (KeyError, StopIteration):          # an index expression of another form
        return None
    return te.create_prim_func(ins + [out])


def checked(func: tirx.PrimFunc | None, gensor, sketch: str, extents: tuple[int, ...]) -> bool:
    """The bridge kernel is what the tree assumed: its workload has this sketch and these extents."""
    wl = gensor.workload(func) if func is not None else None
    return wl is not None and wl.extents == tuple(extents) and sketch_of(wl) == sketch


def _iterator_of(index, ivs) -> int | None:
    """Which block iterator an index is, if it is one (TVM Vars compare by identity: same_as)."""
    return next((d for d, iv in enumerate(ivs) if isinstance(index, tirx.Var) and iv.var.same_as(index)), None)


def _product_reads(store: tirx.BufferStore) -> list | None:
    """The two buffer reads of `out[i] = out[i] + a[...] * b[...]` (either order of the add)."""
    v = store.value
    if not isinstance(v, tirx.Add):
        return None
    for acc, prod in ((v.a, v.b), (v.b, v.a)):
        if (isinstance(acc, TensorLoad) and acc.source.same_as(store.buffer) and isinstance(prod, tirx.Mul)
                and isinstance(prod.a, TensorLoad) and isinstance(prod.b, TensorLoad)):
            return [prod.a, prod.b]
    return None


def _reach(indices, domain: dict) -> tuple[int, ...] | None:
    """The buffer shape the indices reach over the iteration domain (max + 1 per dimension)."""
    analyzer = tvm.sym.Analyzer()
    for var, ext in domain.items():
        analyzer.bind(var, tvm.ir.Range(0, ext))
    shape = []
    for index in indices:
        bound = analyzer.const_int_bound(index)
        if bound.min_value < 0 or bound.max_value >= 1 << 30:
            return None
        shape.append(int(bound.max_value) + 1)
    return tuple(shape)


_BINARY = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
           tirx.FloorDiv: tirx.floordiv, tirx.FloorMod: tirx.floormod}


def _rebuild(expr, env: dict):
    """An index expression over the new iterators (KeyError on other node types)."""
    if isinstance(expr, tirx.Var):
        return next(v for k, v in env.items() if k.same_as(expr))
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    return _BINARY[type(expr)](_rebuild(expr.a, env), _rebuild(expr.b, env))
