"""`pack conformance`: ONNX's backend node test cases through the packager and our runtime.

The onnx wheel ships the generators of its node tests (`collect_testcases()`: each a model plus
input and expected output arrays). For every case whose operators the packager claims, the case
is built for this machine's x86-64 target, run by packrt-run, and compared with the expected
outputs at the case's own tolerance.

Two adaptations, both semantics-preserving: a case written at an opset outside 11-21 is moved to
the nearest supported opset when every operator's contract (attributes, inputs, outputs) is the
same there (opset 22 re-versioned many operators only to add bfloat16); and inputs that are
shape operands (Reshape's shape, Slice's starts, a Reduce's axes, ...) become initializers with the
test's values, since the packager compiles static shapes (a deployed model has them constant).
Cases with element types the packager does not support are skipped, not failed.
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import shutil
import subprocess
import tempfile
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import PackagerError, UnsupportedConfigError
from ..frontend.model import ONNX_DTYPES, STATIC_OPERANDS, SUPPORTED_OPS
from ..frontend.opset import OPSET_MAX, OPSET_MIN, default_opset, relabel


COMPOSITE = "(composite)"


@dataclass
class CaseResult:
    name: str
    op: str
    status: str                    # "pass" | "fail" | "differs" | "unsupported" | "skipped"
    detail: str = ""


def main_op(model: onnx.ModelProto) -> str:
    """The operator a case tests. Cases built from several operators (ONNX's expanded function
    tests of composite ops such as Attention) are grouped as COMPOSITE."""
    ops = {n.op_type for n in model.graph.node}
    return ops.pop() if len(ops) == 1 else COMPOSITE


def collect(ops: set[str] | None = None) -> list:
    """Node test cases whose every node is an operator the packager claims (default domain)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    out = []
    for c in cases:
        nodes = c.model.graph.node
        if not nodes or any(n.domain not in ("", "ai.onnx") or n.op_type not in SUPPORTED_OPS for n in nodes):
            continue
        if ops and not {n.op_type for n in nodes} & ops:
            continue
        out.append(c)
    return sorted(out, key=lambda c: c.name)


def prepare(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]] | str:
    """The case's model (adapted as described above), inputs and expected outputs, or a skip reason."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    version = default_opset(model)
    why = relabel(model, min(max(version, OPSET_MIN), OPSET_MAX)) if version else "no default-domain opset"
    if why:
        return why
    inputs_arr, expected = ([numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)
                             for a in arrays] for arrays in case.data_sets[0])
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in inits]
    feeds = {v.name: np.asarray(a) for v, a in zip(graph_inputs, inputs_arr)}
    for v in list(model.graph.input) + list(model.graph.output):
        elem = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else None
        if elem not in ONNX_DTYPES:
            return f"element type {onnx.TensorProto.DataType.Name(elem) if elem else 'non-tensor'} not supported"
    constant = {n.input[i] for n in model.graph.node for i in STATIC_OPERANDS.get(n.op_type, ())
                if i < len(n.input) and n.input[i] in feeds}
    for name in constant:
        model.graph.initializer.append(numpy_helper.from_array(feeds.pop(name), name))
    keep = [v for v in model.graph.input if v.name not in constant]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return model, feeds, [np.asarray(e) for e in expected]


def _spec(folder: Path, feeds: dict[str, np.ndarray], database: Path) -> Path:
    # strict: a case rates what the packager compiles, never what partial offload leaves to ONNX Runtime;
    # the run's own tuning database: a case rates the schedules chosen for it, not a user's records
    lines = ["name: case", "model: model.onnx", "targets: [x86-64]", "onnxruntime: {fallback: false}",
             f"optimize: {{tuning: {{database: '{database}'}}}}", "inputs:" if feeds else "inputs: {}"]
    lines += [f"  '{n}': {{shape: {list(a.shape)}}}" for n, a in feeds.items()]
    (folder / "spec.yaml").write_text("\n".join(lines) + "\n")
    return folder / "spec.yaml"


def run_case(case, cli: str, work: Path) -> CaseResult:
    """Build the case (tuning records in `work`/tuning, shared by the run's cases), run it, compare."""
    from ..build import build
    from ..emit.manifest import output_file
    from ..spec import load_spec

    op = main_op(case.model)
    prepared = prepare(case)
    if isinstance(prepared, str):
        return CaseResult(case.name, op, "skipped", prepared)
    model, feeds, expected = prepared
    folder, database = work / case.name, work / "tuning"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    try:
        pkg = build(load_spec(_spec(folder, feeds, database)), log=lambda _m: None, bundle_runtime=False,
                    html_report=False)
    except UnsupportedConfigError as e:
        return CaseResult(case.name, op, "unsupported", str(e).split(": ", 1)[-1][:300])
    except PackagerError as e:
        msg = str(e).split(": ", 1)[-1]
        status = "skipped" if "element type" in msg else "fail"
        return CaseResult(case.name, op, status, f"build: {msg[:300]}")
    except Exception as e:  # noqa: BLE001 - any crash is a failed case, reported
        return CaseResult(case.name, op, "fail", f"build crashed: {type(e).__name__}: {str(e)[:300]}")
    args = []
    for i, (name, arr) in enumerate(feeds.items()):
        np.save(folder / f"in{i}.npy", arr)
        args += ["--input", f"{name}={folder / f'in{i}.npy'}"]
    r = subprocess.run([cli, str(pkg), *args, "--output-dir", str(folder), "--iters", "1", "--warmup", "0",
                        "--threads", "1"], capture_output=True, text=True)
    if r.returncode != 0:
        return CaseResult(case.name, op, "fail", f"run: {r.stderr.strip()[-300:]}")
    got = [np.load(folder / output_file(out.name)) for out in model.graph.output]
    mismatch = _mismatch(model, got, expected, case)
    if mismatch and _onnxruntime_agrees(model, feeds, got, expected, case):
        return CaseResult(case.name, op, "differs", f"{mismatch}; onnxruntime computes the same as ours")
    if mismatch:
        return CaseResult(case.name, op, "fail", mismatch)
    shutil.rmtree(folder, ignore_errors=True)
    return CaseResult(case.name, op, "pass")


def _mismatch(model: onnx.ModelProto, got: list[np.ndarray], expected: list[np.ndarray], case) -> str:
    """'' when every output matches at the case's tolerance, else what differs first."""
    for out, ours, want in zip(model.graph.output, got, expected):
        try:
            if want.dtype.kind in "fc":
                np.testing.assert_allclose(ours, want, rtol=case.rtol, atol=case.atol)
            else:
                np.testing.assert_array_equal(ours, want)
        except AssertionError as e:
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            return f"output {out.name}: {' '.join(lines[1:3])[:300]}"
    return ""


def _onnxruntime_agrees(model: onnx.ModelProto, feeds: dict, got: list[np.ndarray], expected: list[np.ndarray],
                        case) -> bool:
    """Whether onnxruntime, the runtime packages are verified and deployed against, misses ONNX's
    expected output the same way we do (e.g. Resize align_corners with a fractional downscale):
    such a case shows where the two references differ, not a packager bug."""
    try:
        from ..frontend.ort_run import ort_session
        theirs = ort_session(model.SerializeToString(), exact=True).run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime cannot run the case: no evidence either way
        return False
    return bool(_mismatch(model, theirs, expected, case)) and not _mismatch(model, got, theirs, case)


@functools.lru_cache(maxsize=1)
def _cases_by_name() -> dict:
    return {c.name: c for c in collect()}


def _worker(args) -> dict:
    name, cli, work = args
    return asdict(run_case(_cases_by_name()[name], cli, Path(work)))


def run(names: list[str], jobs: int = 2, progress=None) -> list[CaseResult]:
    from ..emit.runtime import build_runtime
    from ..targets import host_arch

    cli = str(build_runtime(host_arch()) / "bin" / "packrt-run")
    results = []
    with tempfile.TemporaryDirectory(prefix="pack-conformance-") as work:
        tasks = [(n, cli, work) for n in names]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(max(1, jobs)) as pool:
            for k, r in enumerate(pool.imap_unordered(_worker, tasks, chunksize=4)):
                results.append(CaseResult(**r))
                if progress:
                    progress(k + 1, len(tasks), results[-1])
    return sorted(results, key=lambda r: r.name)


STATUSES = ("pass", "fail", "differs", "unsupported", "skipped")


def per_op(results: list[CaseResult]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    for r in results:
        table[r.op][r.status] += 1
    return dict(sorted(table.items(), key=lambda kv: (kv[0] == COMPOSITE, kv[0])))


def pass_rate(counts: dict[str, int]) -> float | None:
    """Passed over passed + failed: unsupported configurations (rejected with a clear error),
    skipped cases (element types or opsets outside the packager's range) and cases where
    onnxruntime misses ONNX's expected output exactly as we do ("differs") are reported, not rated."""
    ran = counts["pass"] + counts["fail"]
    return counts["pass"] / ran if ran else None


def markdown_table(results: list[CaseResult]) -> str:
    """The README's operator table: per operator, cases passed / failed / rejected / skipped."""
    rows = ["| operator | passed | failed | as onnxruntime, not ONNX | unsupported config | skipped | pass rate |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    total = dict.fromkeys(STATUSES, 0)
    for op, c in per_op(results).items():
        rate = pass_rate(c)
        rows.append(f"| {op} | {c['pass']} | {c['fail']} | {c['differs']} | {c['unsupported']} | {c['skipped']} | "
                    f"{'-' if rate is None else f'{100 * rate:.0f}%'} |")
        for k in STATUSES:
            total[k] += c[k]
    rate = pass_rate(total)
    rows.append(f"| **all** | {total['pass']} | {total['fail']} | {total['differs']} | {total['unsupported']} | "
                f"{total['skipped']} | "
                f"{'-' if rate is None else f'{100 * rate:.1f}%'} |")
    return "\n".join(rows)


README_BEGIN, README_END = "<!-- conformance:begin -->", "<!-- conformance:end -->"


def update_readme(path: Path, table: str) -> None:
    """Replace the text between the conformance markers in a README with `table`."""
    text = path.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise PackagerError(f"{path} has no {README_BEGIN} ... {README_END} section to update")
    head, rest = text.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    path.write_text(f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}")


def load_expected(path: Path) -> dict[str, str]:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_expected(path: Path, results: list[CaseResult]) -> None:
    path.write_text(json.dumps({r.name: r.status for r in results}, indent=1, sort_keys=True) + "\n")
