"""The device half of `pack gpu-suite`: copied into the bundle as device.py and run where the GPU is,
in one command, with nothing there but Python, numpy and (for the baseline) PyTorch; it imports
neither TVM, the packager nor onnxruntime.

    python BUNDLE/device.py [--iters 50] [--no-compile] [--no-sanitizer] [--out results.json]

Per package and target (CUDA targets, or CPU targets when the bundle was built for them):
  check      packrt-run --check: the target on the reference inputs stored in the package vs
             onnxruntime's outputs stored with them
  graph      CUDA targets: outputs of a CUDA-graph replay equal a plain run's, bit for bit
  pointers   the C API on the device's own buffers (packrt_run_device with PyTorch's CUDA tensors
             and stream; packrt_run with host buffers for CPU targets) equals packrt-run's outputs
  latency    packrt-run's median, and with --cuda-graph for CUDA targets
  barriers   CUDA targets with cooperative (grid-synchronized) kernels: the check again under
             compute-sanitizer's synccheck and memcheck, which must report no error
  pytorch    zoo models: the same network and weights (seeded construction, checked against the
             stored reference outputs) in eager mode and under torch.compile; TF32 off (fp32)
Writes results.json and results.md (a table) next to the bundle's suite.json (or --out), after
every row, so a run cut short keeps what it did; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DTYPES = {1: np.float32, 2: np.float16, 3: np.float64, 4: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
          8: np.uint8, 9: np.bool_}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class Tensor(ctypes.Structure):
    """packrt_tensor (include/packrt/packrt.h)."""
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * 8), ("nbytes", ctypes.c_uint64)]


class Options(ctypes.Structure):
    """packrt_options (include/packrt/packrt.h)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("target", ctypes.c_char_p), ("num_threads", ctypes.c_int32),
                ("verify_checksums", ctypes.c_int32), ("device_type", ctypes.c_int32),
                ("cuda_device", ctypes.c_int32), ("cuda_graph", ctypes.c_int32), ("expected_sha256", ctypes.c_char_p)]


def reference(pkg: Path, target: str = "") -> list[dict]:
    """Per profile: name, inputs and outputs (numpy) stored in the package, with the tolerance
    `target` is held to (its own where it was built in reduced precision)."""
    m = json.loads((pkg / "manifest.json").read_text())
    doc = json.loads((pkg / m["reference"]).read_text())
    tol = doc.get("targets", {}).get(target, doc)
    return [{"name": p["name"], "inputs": {k: np.load(pkg / v) for k, v in p["inputs"].items()},
             "outputs": {k: np.load(pkg / v) for k, v in p["outputs"].items()},
             "rtol": tol["rtol"], "atol": tol["atol"]}
            for p in doc["profiles"]]


def precision_of(pkg: Path, target: str) -> str:
    """The precision the package's target was built in (fp32 for packages from before it was recorded)."""
    m = json.loads((pkg / "manifest.json").read_text())
    return next((t.get("precision", "fp32") for t in m.get("targets", []) if t.get("name") == target), "fp32")


def within(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[bool, float]:
    """`pack verify`'s rule, in short: |ours - ref| <= max(atol, rtol * scale) + rtol * |ref|."""
    if ours.shape != ref.shape:
        return False, float("inf")
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    scale = float(np.abs(b[np.isfinite(b)]).max(initial=0))
    diff = np.abs(a - b)
    ok = bool(np.all(diff <= max(atol, rtol * scale) + rtol * np.abs(b)))
    return ok, float(diff.max(initial=0))


def accuracy(ours: np.ndarray, ref: np.ndarray) -> dict:
    """A reduced-precision output against onnxruntime's fp32 one: max and mean error relative to the
    tensor's max |value|, and the share of rows (last axis) whose argmax agrees (pack verify's
    error_statistics; this half imports nothing of the packager)."""
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    scale = float(np.abs(b[np.isfinite(b)]).max(initial=0)) or 1.0
    err = np.abs(a - b)
    out = {"max_err_over_scale": float(err.max(initial=0) / scale), "mean_err_over_scale": float(err.mean() / scale)}
    if b.ndim >= 1 and b.shape[-1] >= 2:
        rows_a, rows_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        out["argmax_agreement"] = float((rows_a.argmax(-1) == rows_b.argmax(-1)).mean())
    return out


def packrt_run(bundle: Path, args: list, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(bundle / "bin" / "packrt-run"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def cooperative_kernels(pkg: Path, target: str) -> int:
    """Cooperative launches in the target's plan (global fusion's grid-synchronized phases)."""
    m = json.loads((pkg / "manifest.json").read_text())
    plan = next((t.get("plan") for t in m.get("targets", []) if t.get("name") == target), None)
    if not plan:
        return 0
    doc = json.loads((pkg / plan).read_text())
    return sum(1 for k in doc.get("kernels", []) for ln in k.get("launches", []) if ln.get("cooperative"))


def sanitized(bundle: Path, pkg: Path, target: str) -> str:
    """'clean', or the first lines compute-sanitizer (synccheck, then memcheck) printed."""
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return "compute-sanitizer not found"
    for check in ("synccheck", "memcheck"):
        r = subprocess.run([tool, "--tool", check, "--error-exitcode", "9", str(bundle / "bin" / "packrt-run"),
                            str(pkg), "--check", "--target", target], capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            return f"{check}: " + " | ".join((r.stdout + r.stderr).strip().splitlines()[:6])[:400]
    return "clean"


def run_outputs(bundle: Path, pkg: Path, target: str, prof: dict, work: Path, graph: bool) -> dict[str, np.ndarray]:
    """packrt-run on the profile's reference inputs; its outputs."""
    args = [pkg, "--target", target, "--output-dir", work, "--iters", "3" if graph else "1", "--warmup", "0"]
    for k, (name, arr) in enumerate(prof["inputs"].items()):
        np.save(work.parent / f"{work.name}-in{k}.npy", arr)
        args += ["--input", f"{name}={work.parent / f'{work.name}-in{k}.npy'}"]
    r = packrt_run(bundle, args + (["--cuda-graph"] if graph else []))
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return {p.stem: np.load(p) for p in work.glob("*.npy")}


def latency(bundle: Path, pkg: Path, target: str, prof: dict, work: Path, iters: int, graph: bool) -> float:
    args = [pkg, "--target", target, "--iters", iters, "--warmup", max(3, iters // 10), "--json", "-"]
    for k, name in enumerate(prof["inputs"]):
        args += ["--input", f"{name}={work.parent / f'{work.name}-in{k}.npy'}"]
    r = packrt_run(bundle, args + (["--cuda-graph"] if graph else []))
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return float(json.loads(r.stdout[r.stdout.index("{"):])["median_ms"])


def through_the_c_api(bundle: Path, pkg: Path, target: str, prof: dict, cuda: bool) -> dict[str, np.ndarray]:
    """The C API on this process's own buffers: PyTorch CUDA tensors + stream (CUDA targets) or
    numpy arrays (CPU targets)."""
    lib = ctypes.CDLL(str(bundle / "lib" / "libpackrt.so"))
    lib.packrt_last_error.restype = ctypes.c_char_p
    opt = Options()
    lib.packrt_options_init(ctypes.byref(opt))
    opt.target = target.encode()
    model = ctypes.c_void_p()
    if lib.packrt_open(str(pkg).encode(), ctypes.byref(opt), ctypes.byref(model)) != 0:
        raise RuntimeError(lib.packrt_last_error().decode())
    try:
        keep, ins = [], (Tensor * len(prof["inputs"]))()
        for t, (name, arr) in zip(ins, prof["inputs"].items()):
            buf = _buffer(np.ascontiguousarray(arr), cuda)
            keep.append(buf)
            _describe(t, name, arr.dtype, arr.shape, _pointer(buf), arr.nbytes)
        outs, out_bufs = (Tensor * len(prof["outputs"]))(), []
        for t, (name, ref) in zip(outs, prof["outputs"].items()):
            buf = _buffer(np.zeros_like(ref), cuda)
            out_bufs.append(buf)
            _describe(t, name, ref.dtype, ref.shape, _pointer(buf), ref.nbytes)
        if cuda:
            import torch
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = lib.packrt_run_device(model, ins, len(ins), outs, len(outs), stream)
        else:
            rc = lib.packrt_run(model, ins, len(ins), outs, len(outs))
        if rc != 0:
            raise RuntimeError(lib.packrt_last_error().decode())
        return {name: (b.cpu().numpy() if cuda else b) for name, b in zip(prof["outputs"], out_bufs)}
    finally:
        lib.packrt_close(model)


def _buffer(arr: np.ndarray, cuda: bool):
    if not cuda:
        return arr.copy()
    import torch
    return torch.from_numpy(arr.copy()).cuda()


def _pointer(buf) -> int:
    return buf.data_ptr() if hasattr(buf, "data_ptr") else buf.ctypes.data


def _describe(t: Tensor, name: str, dtype, shape, ptr: int, nbytes: int) -> None:
    t.name, t.data, t.dtype, t.ndim, t.nbytes = name.encode(), ptr, CODES[np.dtype(dtype)], len(shape), nbytes
    for i, d in enumerate(shape):
        t.shape[i] = d


def pytorch(info: dict, prof: dict, cuda: bool, iters: int, compile_too: bool, precision: str = "fp32") -> dict:
    """The zoo network in PyTorch with the package's weights (seeded construction, as
    samples/zoo/make_zoo.py exports it), checked against the stored reference, then timed; for an
    fp16 package under CUDA autocast to fp16 (PyTorch's own mixed precision: matmuls and convs in
    fp16 on tensor cores, sensitive ops in fp32)."""
    import contextlib

    import torch

    sys.path.insert(0, str(HERE))
    import models  # the bundle's copy of samples/zoo/models.py

    torch.backends.cuda.matmul.allow_tf32 = False      # fp32 like the package
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(info["seed"])
    net = getattr(models, info["ctor"])(**info["kwargs"])
    if info["init_transformer"]:
        models.init_transformer(net)
    device = "cuda" if cuda else "cpu"
    net = net.eval().to(device)
    xs = [torch.from_numpy(a).to(device) for a in prof["inputs"].values()]   # the model's inputs, in order
    out: dict = {"device": device, "tf32": False, "precision": precision}
    amp = (torch.autocast("cuda", dtype=torch.float16) if cuda and precision == "fp16"
           else contextlib.nullcontext())
    with torch.no_grad(), amp:
        got = net(*xs).float().cpu().numpy()
        ok, err = within(got, next(iter(prof["outputs"].values())), prof["rtol"] * 10, prof["atol"] * 10)
        out["same_weights"], out["max_abs_vs_reference"] = ok, err
        out["eager_ms"] = _time(lambda: net(*xs), iters, cuda)
        if compile_too:
            try:
                compiled = torch.compile(net)
                out["compile_ms"] = _time(lambda: compiled(*xs), iters, cuda)
            except Exception as e:  # noqa: BLE001 - torch.compile fails in many ways; the table says how
                out["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return out


def _time(fn, iters: int, cuda: bool) -> float:
    import torch

    for _ in range(max(3, iters // 10)):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def run_target(bundle: Path, entry: dict, target: str, kind: str, work: Path, args) -> dict:
    """Every check of one package on one target (first profile for the timings)."""
    pkg = bundle / entry["package"]
    row: dict = {"model": entry["name"], "target": target, "kind": kind, "precision": precision_of(pkg, target)}
    r = packrt_run(bundle, [pkg, "--check", "--target", target])
    row["check"] = "ok" if r.returncode == 0 else ("MISMATCH" if r.returncode == 1 else "error")
    row["check_output"] = (r.stdout + r.stderr).strip().splitlines()[1:]
    prof = reference(pkg, target)[0]
    cuda = kind == "cuda"
    try:
        plain = run_outputs(bundle, pkg, target, prof, work / f"{entry['name']}-{target}-plain", graph=False)
        if row["precision"] != "fp32":
            row["accuracy"] = {k: accuracy(plain[_file(k)], v) for k, v in prof["outputs"].items()}
        if cuda:
            graph = run_outputs(bundle, pkg, target, prof, work / f"{entry['name']}-{target}-graph", graph=True)
            row["graph_equals_plain"] = all(np.array_equal(plain[k], graph[k]) for k in plain)
        api = through_the_c_api(bundle, pkg, target, prof, cuda)
        row["c_api_equals_cli"] = all(np.array_equal(api[k], plain[_file(k)]) for k in api)
        row["ms"] = latency(bundle, pkg, target, prof, work / f"{entry['name']}-{target}-plain", args.iters, False)
        if cuda:
            row["graph_ms"] = latency(bundle, pkg, target, prof, work / f"{entry['name']}-{target}-plain", args.iters,
                                      True)
            row["cooperative"] = cooperative_kernels(pkg, target)
            if row["cooperative"] and not args.no_sanitizer:
                row["barriers"] = sanitized(bundle, pkg, target)
    except Exception as e:  # noqa: BLE001 - recorded in the table; the run goes on with the next target
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if entry.get("torch") and not args.no_pytorch:
        try:
            row["pytorch"] = pytorch(entry["torch"], prof, cuda, args.iters, not args.no_compile, row["precision"])
        except Exception as e:  # noqa: BLE001
            row["pytorch"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return row


def _file(name: str) -> str:
    """The .npy stem packrt-run writes for output `name`."""
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name) or "output"


def passed(row: dict) -> bool:
    return (row["check"] == "ok" and "error" not in row and row.get("graph_equals_plain", True)
            and row.get("c_api_equals_cli", False) and row.get("pytorch", {}).get("same_weights", True)
            and row.get("barriers", "clean") == "clean")


def table(rows: list[dict]) -> str:
    def ms(x):
        return f"{x:.3f}" if isinstance(x, float) else "-"

    lines = ["| model | target | check | graph = plain | C API = CLI | ours ms | ours + graph ms | PyTorch eager ms "
             "| torch.compile ms | eager / ours | notes |", "|" + "---|" * 11]
    for r in rows:
        pt = r.get("pytorch", {})
        best = r.get("graph_ms", r.get("ms"))
        ratio = f"{pt['eager_ms'] / best:.2f}" if "eager_ms" in pt and isinstance(best, float) else "-"
        coop = (f"{r['cooperative']} cooperative kernel(s), sanitizer {r.get('barriers', 'not run')}"
                if r.get("cooperative") else "")
        acc = "; ".join(f"{k}: mean err/scale {v['mean_err_over_scale']:.2g}"
                        + (f", argmax {v['argmax_agreement']:.1%}" if "argmax_agreement" in v else "")
                        for k, v in r.get("accuracy", {}).items())
        notes = "; ".join(x for x in (r.get("error", ""), pt.get("error", ""), pt.get("compile_error", ""),
                                      "" if pt.get("same_weights", True) else "PyTorch weights differ", coop, acc)
                          if x)
        target = r["target"] + ("" if r.get("precision", "fp32") == "fp32" else f" {r['precision']}")
        lines.append(f"| {r['model']} | {target} | {r['check']} | {r.get('graph_equals_plain', '-')} | "
                     f"{r.get('c_api_equals_cli', '-')} | {ms(r.get('ms'))} | {ms(r.get('graph_ms'))} | "
                     f"{ms(pt.get('eager_ms'))} | {ms(pt.get('compile_ms'))} | {ratio} | {notes} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the GPU suite bundle on this machine.")
    ap.add_argument("--bundle", type=Path, default=HERE)
    ap.add_argument("--out", type=Path, help="results.json (default: in the bundle); results.md beside it")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-pytorch", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--only", action="append", help="only these models")
    ap.add_argument("--no-sanitizer", action="store_true",
                    help="skip compute-sanitizer on cooperative kernels (minutes on large models)")
    args = ap.parse_args(argv)
    bundle = args.bundle.resolve()
    suite = json.loads((bundle / "suite.json").read_text())
    work = bundle / "work"
    work.mkdir(exist_ok=True)
    out = args.out or bundle / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = _environment()
    rows: list[dict] = []
    md = write_results(out, suite, env, rows)
    for entry in suite["models"]:
        if args.only and entry["name"] not in args.only:
            continue
        for target, kind in entry["targets"].items():
            t0 = time.perf_counter()
            rows.append(run_target(bundle, entry, target, kind, work, args))
            print(f"{entry['name']:14s} {target:8s} {'PASS' if passed(rows[-1]) else 'FAIL'} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            md = write_results(out, suite, env, rows)     # after every row: a run cut short keeps what it did
    print(md)
    return 0 if rows and all(passed(r) for r in rows) else 1


def write_results(out: Path, suite: dict, env: dict, rows: list[dict]) -> str:
    """results.json and results.md (the table) at `out`; returns the table."""
    out.write_text(json.dumps({"suite": suite, "environment": env, "rows": rows}, indent=1) + "\n")
    md = f"# GPU suite on {env.get('gpu', 'no GPU')} ({env.get('torch', 'no torch')})\n\n" + table(rows)
    out.with_suffix(".md").write_text(md)
    return md


def _environment() -> dict:
    env = {"python": sys.version.split()[0], "numpy": np.__version__}
    try:
        import torch
        env["torch"] = f"torch {torch.__version__}"
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return env


if __name__ == "__main__":
    sys.exit(main())
