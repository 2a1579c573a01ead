"""Operator fusion: TVM's FuseOps + FuseTIR over the legalized graph.

Element-wise and broadcast ops are fused into the producing conv/matmul (their epilogue) or
into each other, so intermediate tensors never reach memory. This is rule-based fusion by op
pattern; the global_fusion pass (globalfuse/) then fuses across what these rules leave apart.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .base import PassReport


def _n_calls(mod: tvm.IRModule) -> int:
    main = mod["main"]
    return sum(1 for blk in main.body.blocks for b in blk.bindings
               if getattr(getattr(b.value, "op", None), "name", None) == "relax.call_tir")


def fuse(mod: tvm.IRModule) -> tuple[tvm.IRModule, PassReport]:
    before = _n_calls(mod)
    mod = tvm.transform.Sequential([
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])(mod)
    after = _n_calls(mod)
    return mod, PassReport("fusion", "applied", f"{before} -> {after} kernel calls",
                           {"kernels_before": before, "kernels_after": after})
