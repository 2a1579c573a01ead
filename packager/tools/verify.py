"""`pack verify PKG`: run every compiled target of a package and compare it with onnxruntime.

Each target runs through the package's own packrt-run binary (ARM64 under qemu-aarch64 on an
x86 host), on seeded random inputs for every shape profile; onnxruntime's CPU EP on the source
model gives the reference. For a model split between ONNX Runtime and compiled parts, the
reference run also returns every tensor that crosses a part boundary, so each part is checked on
its own, on every target. Then, where the package has a custom-op library for this machine, the
wrapper model ort/model.onnx runs in onnxruntime end to end. A target the host cannot execute is
reported as skipped.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..codegen.backend import backend_for
from ..emit.manifest import open_package
from ..emit.reference import read_reference, read_spread
from ..errors import UserError
from ..frontend import load_model, random_inputs, without_static_control_flow
from ..frontend.rounding import STEP_SHARE, flips_for, quantization_steps, reference_spread
from ..targets import host_arch
from .emulate import emulate, read_emulation
from ..frontend.ort_run import cuda_ep_available, model_reference
from .runners import find_model, run_package, runner_command, units_of, wrapper_outputs

ORT_CHECK = "onnxruntime"          # the row name of the end-to-end check through ort/model.onnx
EMULATION_BLIND_SPOTS = ("the schedules' arithmetic and indexing are checked; not the fatbin, the driver API, "
                         "cooperative launches, CUDA graphs, warp shuffles or timing (`pack gpu-suite` on a GPU)")


@dataclass
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    ok: bool
    outside: float = 0.0           # share of elements outside the bound (tolerated rounding flips)
    precision: str = "fp32"        # the target's (optimize.precision); reduced ones get the statistics below
    mean_rel: float | None = None  # mean |error| / the tensor's max |value|
    argmax: float | None = None    # share of rows (last axis) whose argmax agrees: a classifier's top-1


@dataclass
class TargetResult:
    target: str
    profile: str
    status: str                    # "pass" | "fail" | "skipped"
    reason: str = ""
    outputs: list[OutputCheck] = field(default_factory=list)
    part: str = ""
    emulated: bool = False         # a CUDA target's kernels run as OpenCL on PoCL (reason: what that covered)


def compare(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float,
            flips: float = 0.0, step: float = 0.0, spread: float = 0.0) -> tuple[float, float, bool, float]:
    """Max abs error, max error relative to the tensor's scale, the verdict (NaNs and infinities
    must match), and the share of elements outside the bound.

    Why the scale: the build's own approximations (fp32 reassociation in blocked, vectorized and
    re-laid-out reductions; fastmath's polynomial exp/erf/tanh) err in proportion to the
    magnitudes a value was computed from, not to the value itself. An element that cancels to
    near zero inside a tensor of magnitude 100 legitimately carries an error of ~1e-5 * 100, which
    a plain allclose at atol 1e-5 calls a failure (intermediate tensors of un-normalized CNNs
    did). So every element must satisfy |ours - ref| <= max(atol, rtol * scale) + rtol * |ref|,
    scale = max |ref| over the finite values of the tensor. A wrong kernel still fails: its errors
    are of the order of the scale itself, thousands of times this bound.

    `flips`, `step` and `spread`: the allowances of a model that quantizes activations
    (frontend/rounding.py): that share of elements may be outside the bound; failing that, every
    element must be within max(step, spread) of the bound, where `step` is the quantization step
    of a dequantized tensor (then at most STEP_SHARE of its elements may be off) and `spread` how
    far the reference itself moves under float noise on its inputs. A wrong kernel moves most
    elements, or by more than that."""
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return float("inf"), float("inf"), False, 1.0
    if ours.dtype == bool or np.issubdtype(ours.dtype, np.integer):
        diff = np.abs(ours.astype(np.int64) - ref.astype(np.int64)).astype(np.float64)
        outside = float((diff != 0).mean()) if diff.size else 0.0
        return float(diff.max(initial=0)), float(diff.max(initial=0)), outside <= flips, outside
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(b)
    scale = float(np.abs(b[finite]).max(initial=0))
    same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(b) & (a == b))
    with np.errstate(invalid="ignore"):                # inf - inf where both are the same infinity
        diff = np.where(same_special, 0.0, np.abs(a - b))
    diff[np.isnan(diff)] = np.inf                       # NaN on one side only
    bound = max(atol, rtol * scale) + rtol * np.where(finite, np.abs(b), 0)
    bad = diff > bound
    outside = float(bad.mean()) if bad.size else 0.0
    ok = outside <= flips and bool(np.isfinite(diff).all())
    extra = max(step, spread) * (1 + 1e-3)             # one allowance, not the two added up
    if extra and not ok and bool(np.isfinite(diff).all()):
        ok = bool((diff <= bound + extra).all()) and (not step or outside <= STEP_SHARE)
    return float(diff.max(initial=0)), float(diff.max(initial=0) / max(scale, atol, 1e-30)), ok, outside


@dataclass
class _Run:
    """One verify run: the package, its units, the tolerances and where reference outputs come from."""

    pkg: object
    units: list
    model_path: Path
    rtol: float
    atol: float
    flips: float                   # share of elements allowed off by a quantization step
    steps: dict                    # tensor -> quantization step of a dequantized tensor (rounding.py)
    boundary: list[str]
    gpu_ref: bool
    work: Path
    emulate: bool = False          # also run CUDA targets' kernels as OpenCL on the CPU
    spread: dict = field(default_factory=dict)   # tensor -> the reference's own move under float noise


def verify_package(path: Path, targets: list[str] | None = None, model: Path | None = None,
                   rtol: float | None = None, atol: float | None = None, log=print,
                   gpu_emulate: bool = False) -> list[TargetResult]:
    """Run every target (or the named ones) on seeded inputs per profile, and the ORT wrapper
    model, against onnxruntime; prints one line per output and returns the results.
    `gpu_emulate`: also run each CUDA target's kernels as OpenCL on the CPU (tools/emulate.py)."""
    pkg = open_package(path)
    model_path = find_model(pkg, model)
    tol = pkg.manifest.get("verify", {})
    rtol = tol.get("rtol", 1e-4) if rtol is None else rtol
    atol = tol.get("atol", 1e-5) if atol is None else atol
    loaded = load_model(model_path)
    dtypes = {i["name"]: i["dtype"] for i in pkg.manifest["inputs"]}
    units = units_of(pkg)
    boundary = [] if len(units) == 1 and not units[0][0] else sorted(
        {t["name"] for _, u in units for t in u.manifest["inputs"] + u.manifest["outputs"]})
    flat = without_static_control_flow(loaded, [{n: tuple(s) for n, s in p["inputs"].items()}
                                                for p in pkg.manifest["profiles"]]) if boundary else loaded
    inlined = flat.proto if flat.control_flow and flat.control_flow.inlined else None
    has_gpu = any(backend_for(t).reference_on_gpu() for _, u in units for t in u.manifest["targets"])
    if gpu_emulate and not any(backend_for(t).emulated() for _, u in units for t in u.manifest["targets"]
                               if not targets or t["name"] in targets):
        raise UserError(f"{path}: --gpu-emulate runs CUDA targets' kernels on the CPU, and "
                        f"{'these targets have' if targets else 'the package has'} no CUDA target")
    results: list[TargetResult] = []
    with tempfile.TemporaryDirectory(prefix="pack-verify-") as tmp:
        flips = flips_for(loaded.proto)
        run = _Run(pkg, units, model_path, rtol, atol, flips, quantization_steps(loaded.proto), boundary,
                   has_gpu and cuda_ep_available(), Path(tmp), gpu_emulate)
        stored = None if model else stored_reference(pkg, units)
        spread = _stored_spread(pkg, units) if stored and flips else None
        for k, prof in enumerate(pkg.manifest["profiles"]):
            if stored:
                inputs, cpu_ref = stored[prof["name"]]
            else:
                inputs = random_inputs(loaded, {n: tuple(s) for n, s in prof["inputs"].items()}, dtypes, seed=k,
                                       values=pkg.manifest.get("verify", {}).get("inputs"))
                cpu_ref = model_reference(model_path, inputs, boundary, inlined)
            gpu_ref = model_reference(model_path, inputs, boundary, inlined, cuda=True) if run.gpu_ref else cpu_ref
            if flips:                                  # stored at build time, else measured here
                run.spread = spread if spread is not None else reference_spread(
                    lambda feeds: model_reference(model_path, feeds, boundary, inlined), inputs, cpu_ref)
            results += _check_targets(run, targets, prof["name"], k, inputs, cpu_ref, gpu_ref)
            if not targets:
                results += _check_wrapper(run, prof["name"], inputs, cpu_ref, gpu_ref)
    _print(log, pkg.name, rtol, atol, flips, run.gpu_ref, results, stored is not None)
    return results


def _stored_spread(pkg, units) -> dict[str, float] | None:
    """The spread stored with the reference data of the package and its parts (None when a
    reference predates it)."""
    found = [read_spread(u.root, u.manifest) for part, u in units if part] + [read_spread(pkg.root, pkg.manifest)]
    if None in found:
        return None
    return {n: v for doc in found for n, v in doc.items()}


def stored_reference(pkg, units) -> dict[str, tuple[dict, dict]] | None:
    """The reference data stored at build time (packager/emit/reference.py), as profile name ->
    (the model's inputs, every tensor a check compares: outputs and part boundaries); None unless
    the package and each part have it."""
    root = read_reference(pkg.root, pkg.manifest)
    parts = [read_reference(u.root, u.manifest) for part, u in units if part]
    if root is None or None in parts:
        return None
    stored = {}
    for name, (inputs, outputs) in root.items():
        compared = {}
        for p in parts:
            compared.update(p[name][0])       # a part's inputs are boundary tensors (or model inputs)
            compared.update(p[name][1])
        stored[name] = (inputs, {**compared, **outputs})
    return stored


def _check_targets(run: _Run, targets: list[str] | None, profile: str, k: int, inputs: dict,
                   cpu_ref: dict, gpu_ref: dict) -> list[TargetResult]:
    """Each unit's targets (every part on its own, fed the reference's boundary tensors)."""
    results = []
    for part, unit in run.units:
        names = [t["name"] for t in unit.manifest["targets"]]
        for name in targets or names:
            if name not in names:
                raise UserError(f"{unit.root}: no target '{name}' (targets: {', '.join(names)})")
            t = unit.target(name)
            ref = gpu_ref if backend_for(t).reference_on_gpu() else cpu_ref
            if run.emulate and backend_for(t).emulated():
                results.append(_check_emulated(run, unit, t, part, profile, inputs, cpu_ref))
            cmd, why = runner_command(run.pkg, t)
            if cmd is None:
                results.append(TargetResult(name, profile, "skipped", why, part=part))
                continue
            feeds = {i["name"]: ref[i["name"]] if i["name"] in ref else inputs[i["name"]]
                     for i in unit.manifest["inputs"]}
            outs = [o["name"] for o in unit.manifest["outputs"]]
            ours = run_package(cmd, unit.root, name, feeds, outs, run.work / f"{part}-{name}-{k}")
            checks = _checks(run, ours, ref, outs, t)
            results.append(TargetResult(name, profile, "pass" if all(c.ok for c in checks) else "fail",
                                        outputs=checks, part=part))
    return results


def _checks(run: _Run, ours: dict, ref: dict, outs: list[str], target: dict) -> list[OutputCheck]:
    """Each output against the reference under verify's rule and the model's quantization
    allowances; a reduced-precision target at the wider tolerance its manifest entry names."""
    tol = target.get("verify", {})
    rtol, atol = max(run.rtol, tol.get("rtol", 0.0)), max(run.atol, tol.get("atol", 0.0))
    checks = [OutputCheck(n, *compare(ours[n], ref[n], rtol, atol, run.flips, run.steps.get(n, 0.0),
                                      run.spread.get(n, 0.0))) for n in outs]
    precision = target.get("precision", "fp32")
    if precision != "fp32":
        for c in checks:
            c.precision = precision
            c.mean_rel, c.argmax = error_statistics(ours[c.name], ref[c.name])
    return checks


def error_statistics(ours: np.ndarray, ref: np.ndarray) -> tuple[float | None, float | None]:
    """What a reduced-precision build costs in accuracy, beyond the pass/fail bound: the mean error
    relative to the tensor's scale, and for outputs with rows (last axis >= 2) the share of rows
    whose argmax agrees (a classifier's top-1 agreement on the verify inputs)."""
    if ours.shape != ref.shape or ref.dtype.kind != "f" or not ref.size:
        return None, None
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    scale = float(np.abs(b[finite]).max(initial=0)) or 1.0
    mean_rel = float(np.abs(a - b)[finite].mean() / scale) if finite.any() else None
    rows = ref.ndim >= 1 and ref.shape[-1] >= 2
    argmax = float((a.reshape(-1, a.shape[-1]).argmax(-1) == b.reshape(-1, b.shape[-1]).argmax(-1)).mean()) \
        if rows else None
    return mean_rel, argmax


def _check_emulated(run: _Run, unit, t: dict, part: str, profile: str, inputs: dict,
                    ref: dict) -> TargetResult:
    """A CUDA target's plan with its kernels as OpenCL on PoCL, against the CPU EP's reference."""
    info = read_emulation(unit.root, t)[2]
    feeds = {i["name"]: ref[i["name"]] if i["name"] in ref else inputs[i["name"]] for i in unit.manifest["inputs"]}
    outs = [o["name"] for o in unit.manifest["outputs"]]
    try:
        ours = emulate(unit.root, t, profile, feeds)
    except UserError as e:
        return TargetResult(t["name"], profile, "skipped", f"{info.summary()}; {e}", part=part, emulated=True)
    checks = _checks(run, ours, ref, outs, t)
    return TargetResult(t["name"], profile, "pass" if all(c.ok for c in checks) else "fail", info.summary(),
                        checks, part, emulated=True)


def _check_wrapper(run: _Run, profile: str, inputs: dict, cpu_ref: dict, gpu_ref: dict) -> list[TargetResult]:
    """ort/model.onnx end to end in onnxruntime (CPU EP, and CUDA EP where it is usable)."""
    results = []
    for row, on_cuda, ref in ((ORT_CHECK, False, cpu_ref), (ORT_CHECK + "-cuda", True, gpu_ref)):
        if on_cuda and not run.gpu_ref:
            continue
        if not on_cuda and not _cpu_target_runs(run):
            results.append(TargetResult(row, profile, "skipped", "the package has no CPU target that runs here"))
            continue
        got = wrapper_outputs(run.pkg, inputs, cuda=on_cuda)
        if isinstance(got, str):
            results.append(TargetResult(row, profile, "skipped", got))
            continue
        checks = _checks(run, got, ref, [o["name"] for o in run.pkg.manifest["outputs"]], _loosest(run))
        results.append(TargetResult(row, profile, "pass" if all(c.ok for c in checks) else "fail", outputs=checks))
    return results


def _loosest(run: _Run) -> dict:
    """The widest target tolerance of the package: the wrapper model runs whichever target the
    execution provider picks."""
    tols = [t.get("verify", {}) for _, u in run.units for t in u.manifest["targets"]]
    return {"verify": {k: max((tol.get(k, 0.0) for tol in tols), default=0.0) for k in ("rtol", "atol")}}


def _cpu_target_runs(run: _Run) -> bool:
    """Whether the wrapper model on onnxruntime's CPU EP has a target to run: a CPU target this host
    executes natively (the custom op runs no emulator)."""
    return any(not backend_for(t).reference_on_gpu() and t.get("arch") == host_arch()
               and runner_command(run.pkg, t)[0] is not None for _, u in run.units for t in u.manifest["targets"])


def _print(log, name: str, rtol: float, atol: float, flips: float, gpu_ref: bool,
           results: list[TargetResult], stored: bool = False) -> None:
    refs = ("CPU EP, stored in the package at build time" if stored else "CPU EP") + (
        " for CPU targets, CUDA EP for CUDA targets" if gpu_ref else "")
    log(f"pack verify {name}: rtol {rtol:g}, atol {atol:g} (at least rtol x the tensor's max |value|), "
        f"reference onnxruntime ({refs}, basic graph optimizations)")
    if flips:
        log(f"  the model quantizes activations: up to {flips:.0%} of a tensor's elements may be off by "
            f"quantization rounding flips; a dequantized tensor up to one quantization step, in up to "
            f"{STEP_SHARE:.0%} of its elements; every element as far as onnxruntime's own output moves under "
            "float noise on the inputs")
    described = set()
    for r in results:
        label = (f"{r.target} [{r.part}]" if r.part else r.target) + (" on PoCL" if r.emulated else "")
        if r.emulated and r.status != "skipped" and label not in described:
            described.add(label)
            log(f"  {label}: {r.reason}")
        if r.status == "skipped":
            log(f"  {label:14s} {r.profile:10s} SKIPPED  {r.reason}")
            continue
        for c in r.outputs:
            reduced = c.precision != "fp32"
            log(f"  {label:14s} {r.profile:10s} {'ok  ' if c.ok else 'FAIL'}    {c.name}: "
                f"max abs err {c.max_abs:.3g}, max err / tensor scale {c.max_rel:.3g}"
                + (f", {c.outside * 100:.2g}% of elements outside" if c.outside or reduced else "")
                + (f"; {c.precision}: mean err / scale {c.mean_rel:.3g}" if reduced and c.mean_rel is not None else "")
                + (f", argmax agrees in {c.argmax:.1%} of rows" if reduced and c.argmax is not None else ""))
    if any(r.emulated for r in results):
        log(f"  on PoCL: {EMULATION_BLIND_SPOTS}")
