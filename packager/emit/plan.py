"""plan.json: the compiled execution plan of one target, read by the C++ runtime.

Schema (format "packager-plan", version 4; 3 added cooperative CUDA launches, 4 assemble steps):
  target, device ("cpu" | "cuda"), weights {file, bytes}, kernels [{name, symbol, num_args, flops, bytes}],
  profiles [{name, arena_bytes, tensors [{dtype, shape, storage: arena|weights, offset, bytes}],
             inputs [{name, tensor}], outputs [{name, tensor}],
             steps [{op: kernel, kernel, args, outputs} | {op: copy, args: [src, dst]}
                    | {op: assemble, args: [parts..., whole]}]}]
Tensor ids index the profile's tensor list; kernel args are inputs then outputs, in the
PrimFunc's parameter order, and `outputs` says how many of the last args the kernel writes (so
the runtime can check the data flow: every arena tensor written once, before it is read, and not
overwritten while it is still to be read). An assemble step moves no data: its parts lie end to end
inside the whole (a concat whose producers wrote their slices in place, in_place.py), and the
runtime checks that they tile it. CUDA plans also name the module (kernels.fatbin) and give each kernel
its device launches [{function, args, grid, block, shared_bytes, cooperative}] (args: PrimFunc
parameter index, or -(k+1) for scratch buffer k; cooperative: a grid-synchronized kernel the
runtime launches with cuLaunchCooperativeKernel, its grid lowered to what the GPU holds resident) and its scratch buffers `workspace` [bytes]. Every input and output has its own arena slot, so the runtime can
stage unaligned caller buffers; aligned ones are bound in place.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..codegen.graph import Graph
from .in_place import roots
from .memory import Lifetime, plan_offsets
from .weights import WeightStore

PLAN_FORMAT, PLAN_VERSION = "packager-plan", 4


@dataclass
class ProfileStats:
    name: str
    steps: int
    kernel_calls: int
    copies: int
    arena_bytes: int
    unplanned_bytes: int           # what one buffer per tensor would need
    assembled: int = 0             # concats whose parts were written in place (assemble steps)
    assembled_bytes: int = 0       # bytes those concat kernels would have copied per run


def _profile(name: str, graph: Graph, kernel_index: dict[str, int], weights: WeightStore,
             input_names: list[str], output_names: list[str]) -> tuple[dict, ProfileStats]:
    tensors = [{"dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes} for t in graph.tensors]
    assemblies = {a.call: a for a in graph.assemblies}
    steps = [{"op": "assemble", "args": [*assemblies[i].parts, assemblies[i].out]} if i in assemblies else
             {"op": "kernel", "kernel": kernel_index[c.kernel], "args": list(c.args), "outputs": c.n_outputs}
             for i, c in enumerate(graph.calls)]

    outputs, seen = [], set()
    for tid, oname in zip(graph.outputs, output_names):
        src = graph.tensors[tid]
        if src.kind != "intermediate" or tid in seen:
            # An output that is an input, a constant or another output gets its own copy.
            tensors.append({"dtype": src.dtype, "shape": list(src.shape), "bytes": src.nbytes})
            new = len(tensors) - 1
            steps.append({"op": "copy", "args": [tid, new]})
            tid = new
        seen.add(tid)
        outputs.append({"name": oname, "tensor": tid})
    inputs = [{"name": n, "tensor": tid} for tid, n in zip(graph.inputs, input_names)]

    n_steps = len(steps)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s, step in enumerate(steps):
        for tid in step["args"]:
            first.setdefault(tid, s)
            last[tid] = s
    for io in inputs:
        first[io["tensor"]] = -1
    for io in outputs:
        last[io["tensor"]] = n_steps
    arena_ids = [i for i in range(len(tensors)) if i >= len(graph.tensors) or graph.tensors[i].kind != "weight"]
    lifetimes = {i: Lifetime(first.get(i, -1), last.get(i, first.get(i, -1)), tensors[i]["bytes"]) for i in arena_ids}
    arena_bytes = _place(tensors, lifetimes, roots(list(assemblies.values())))
    for t in graph.tensors:
        if t.kind == "weight":
            tensors[t.id]["storage"], tensors[t.id]["offset"] = "weights", weights.add(t.value)

    doc = {"name": name, "arena_bytes": arena_bytes, "tensors": tensors,
           "inputs": inputs, "outputs": outputs, "steps": steps}
    stats = ProfileStats(name, n_steps, len(graph.calls) - len(assemblies), n_steps - len(graph.calls), arena_bytes,
                         sum(lt.size for lt in lifetimes.values()), len(assemblies),
                         sum(tensors[a.out]["bytes"] for a in assemblies.values()))
    return doc, stats


def _place(tensors: list[dict], lifetimes: dict[int, Lifetime], parts: dict[int, tuple[int, int]]) -> int:
    """Arena offsets for every tensor in `lifetimes`; a part of an assembled concat lies at its
    offset inside the tensor that holds it, which stays alive for all its parts' lifetimes.
    Returns the arena size."""
    span: dict[int, Lifetime] = {}
    for t, lt in lifetimes.items():
        root = parts.get(t, (t, 0))[0]
        old = span.get(root, lifetimes[root])
        span[root] = Lifetime(min(old.first, lt.first), max(old.last, lt.last), lifetimes[root].size)
    placed = [t for t in lifetimes if t not in parts]
    offsets, arena_bytes = plan_offsets([span[t] for t in placed])
    where = dict(zip(placed, offsets))
    for t in lifetimes:
        root, delta = parts.get(t, (t, 0))
        tensors[t]["storage"], tensors[t]["offset"] = "arena", where[root] + delta
    return arena_bytes


def build_plan(target: str, graphs: dict[str, Graph], kernels: list[tuple[str, str, int]], weights: WeightStore,
               input_names: list[str], output_names: list[str], device: str = "cpu",
               kernel_fields: dict[str, dict] | None = None, plan_fields: dict | None = None
               ) -> tuple[dict, list[ProfileStats]]:
    """The plan document for one target. `kernels` is [(name, symbol, num_args)] in table order;
    the backend adds fields per kernel name (GPU launches) and to the plan (its module file).
    A graph's assembled concats (`graph.assemblies`, in_place.py) become assemble steps."""
    kernel_index = {name: i for i, (name, _, _) in enumerate(kernels)}
    profiles, stats = [], []
    for pname, graph in graphs.items():
        doc, st = _profile(pname, graph, kernel_index, weights, input_names, output_names)
        profiles.append(doc)
        stats.append(st)
    extra = kernel_fields or {}
    plan = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "target": target, "device": device,
            "weights": {"file": "weights.bin", "bytes": weights.size},
            "kernels": [{"name": n, "symbol": s, "num_args": a, **extra.get(n, {})} for n, s, a in kernels],
            "profiles": profiles}
    plan.update(plan_fields or {})
    return plan, stats
