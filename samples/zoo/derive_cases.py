"""EinNet's per-case study (its Table 3) as a kernel table measured on this machine: each case's
operator as the packager builds it without derive vs the derived program the search finds (in
GEMM layout, every scope as the packager builds it: a weight GEMM as the layout pass's packed
matmul, the rest generated; all scheduled by Gensor and timed in alternation with the original).

    python samples/zoo/derive_cases.py [--database DIR]

Conv3x3: the original is the packed-layout conv the layout pass picks (ALT + Gensor, measured);
ConvTranspose: TVM's conv2d_transpose (TOPI, zero-inserted input) scheduled by Gensor.
"""
from __future__ import annotations

import argparse
import json
import time

from packager.optimize.derive.codegen import kernels
from packager.optimize.derive.graph import best_candidate
from packager.optimize.derive.match import instantiate
from packager.optimize.derive.operators import conv2d, conv_transpose2d
from packager.optimize.derive.search import MAX_DEPTH, derive
from packager.optimize.derive.timing import original_conv_transpose, time_program
from packager.optimize.layout.search import ConvSite, LayoutSearch
from packager.optimize.schedule.hardware import cpu_hardware
from packager.spec import TargetSpec
from packager.targets import resolve

CASES = {   # name: (kind, data NCHW, weight, stride, pad); EinNet Table 3's shapes
    "Conv3x3 [1,512,7,7]": ("conv", (1, 512, 7, 7), (512, 512, 3, 3), 1, 1),
    "ConvTranspose [16,448,2,2]": ("convT", (16, 448, 2, 2), (448, 256, 4, 4), 2, 1),
    "ConvTranspose [1,256,4,4] (InfoGAN layer 3)": ("convT", (1, 256, 4, 4), (256, 128, 4, 4), 2, 1),
}


def original_kernel(kind, data, weight, stride, pad, target, database):
    """(the packager's kernel for the operator without derive, what it is)."""
    if kind == "conv":
        site = ConvSite(data, weight, (stride, stride), (pad,) * 4, (1, 1), 1, "float32")
        d = LayoutSearch(target, database, True).decide(site, target.vector_lanes_f32)
        return site.kernel(d.data_block, d.out_block), d.layouts()
    return original_conv_transpose(data, weight, [stride] * 2, [pad] * 4), "NCHW (TOPI conv2d_transpose)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database", default=None, help="tuning database folder (default: the user's)")
    args = ap.parse_args()
    target = resolve(TargetSpec("x86-64", {}, "x86-64"))
    hw = cpu_hardware(target)
    for name, (kind, data, weight, stride, pad) in CASES.items():
        expr = (conv2d(data, weight, (stride,) * 2, (pad,) * 4) if kind == "conv"
                else conv_transpose2d(data, weight, (stride,) * 2, (pad,) * 4))
        t0 = time.perf_counter()
        result = derive(expr, MAX_DEPTH, seconds=60)
        _, cand, program, relaid = best_candidate(result.candidates, hw)
        search_s = time.perf_counter() - t0
        original, layout = original_kernel(kind, data, weight, stride, pad, target, args.database)
        times = time_program(original, program, relaid, target, args.database)
        pieces, steps = kernels(program), cand.steps
        kinds = {p.scope: p.kind for p in instantiate(program)}
        print(json.dumps({"case": name, "original": layout, "original_ms": round(times[0], 4),
                          "derived_ms": round(sum(times[1:]), 4), "speedup": round(times[0] / sum(times[1:]), 2),
                          "pieces_ms": {f"{k.output} ({kinds[k.scope]})": round(t, 4) for k, t in zip(pieces, times[1:])},
                          "derivation": steps, "search": {"states": result.states, "pruned": result.pruned,
                                                          "candidates": len(result.candidates),
                                                          "seconds": round(search_s, 2)}}), flush=True)


if __name__ == "__main__":
    main()
