"""OpenVINO's CPU plugin as a second peer for `pack bench` and `pack corpus`.

onnxruntime is the reference the packages are checked against; OpenVINO is the stronger CPU
runtime a deployment engineer would also try, so the benchmark times it beside both. It runs the
same ONNX file, reshaped to the profile's bound input shapes (what an OpenVINO user deploying one
shape does), in f32 (INFERENCE_PRECISION_HINT: on a CPU with bf16 or AMX units it would otherwise
compute matmuls and convs in bf16, a different arithmetic from ours and onnxruntime's), with the
latency hint and the benchmark's thread count.

It runs in a process of its own, as packrt-run does: in the benchmark's process, onnxruntime's
threads still spin after its runs and took a third off OpenVINO's speed (MobileNetV2: 5.8 ms
there, 4.4 ms alone). The package is optional: without it, or when OpenVINO cannot compile a
model, the report says why and the column stays empty.
"""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def openvino_version() -> str | None:
    """The installed openvino's version (None: not installed), without importing it here."""
    try:
        return importlib.metadata.version("openvino")
    except importlib.metadata.PackageNotFoundError:
        return None


def time_openvino(model_path: Path, shapes: dict[str, tuple[int, ...]], feeds: Path, threads: int, warmup: int,
                  iters: int) -> tuple[list[float] | None, str]:
    """(ms of each of `iters` runs after `warmup`, "") or (None, why not); `feeds`: the inputs as .npz."""
    if openvino_version() is None:
        return None, "openvino is not installed (pip install openvino)"
    r = subprocess.run([sys.executable, "-m", "packager.tools.openvino_peer", str(model_path), str(feeds), str(threads),
                        str(warmup), str(iters), json.dumps({k: list(v) for k, v in shapes.items()})],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None, f"OpenVINO's process failed (exit {r.returncode}): {r.stderr.strip()[-200:]}"
    return (out["ms"], "") if "ms" in out else (None, out["error"])


def _main(model: str, feeds: str, threads: str, warmup: str, iters: str, shapes: str) -> None:
    import openvino as ov

    try:
        core = ov.Core()
        m = core.read_model(model)
        m.reshape(json.loads(shapes))
        compiled = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
                                                 "INFERENCE_NUM_THREADS": int(threads)})
    except Exception as e:  # noqa: BLE001 - OpenVINO's own error kinds: an op or a pattern it lacks
        text = (str(e).strip() or type(e).__name__).splitlines()
        print(json.dumps({"error": f"OpenVINO could not compile the model: {text[0][:200]}"}))
        return
    request = compiled.create_infer_request()
    inputs = dict(np.load(feeds))
    for _ in range(int(warmup)):
        request.infer(inputs)
    ms = []
    for _ in range(int(iters)):
        t0 = time.perf_counter()
        request.infer(inputs)
        ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"ms": ms}))


if __name__ == "__main__":
    _main(*sys.argv[1:])
