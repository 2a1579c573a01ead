"""YAML -> Spec: read the file, check every field, and fail with the file, line and field path
(``targets[1].isa``) and what to write instead, because a deployment engineer fixes specs from
error messages."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import UserError
from .model import (DEFAULT_KEEP_FP32, DIM_MAX, DTYPES, KEEP_FP32_OPS, LEVEL_PASSES, NAME_RE, PASS_NAMES, PRECISIONS,
                    InputSpec, OptimizeSpec, OrtSpec, Profile, Spec, TargetSpec, VerifySpec)


# Entries a spec may expand to (aliases count once per use): a real spec has a few dozen, and the
# bound stops an alias bomb (`b: [*a, *a, ...]` nested) before it takes the machine's memory.
MAX_ENTRIES = 100_000


class _Reader:
    """Walks the parsed YAML, remembering line numbers so errors can point at them."""

    def __init__(self, path: Path, text: str):
        self.path = path
        try:
            self.data = yaml.safe_load(text)
            node = yaml.compose(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            why = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
            raise UserError(f"{path}{where}: not valid YAML: {why}") from None
        except RecursionError:
            raise UserError(f"{path}: not a spec: the YAML is nested too deeply") from None
        self.lines: dict[str, int] = {}
        if node is not None:
            try:
                self._index(node, "")
            except RecursionError:
                raise UserError(f"{path}: not a spec: the YAML is nested too deeply") from None

    def _index(self, node: yaml.Node, path: str) -> None:
        """Remember the line of every field path; reject duplicate keys (YAML silently keeps the last)."""
        if len(self.lines) >= MAX_ENTRIES:
            raise UserError(f"{self.path}: the spec expands to more than {MAX_ENTRIES} entries (nested YAML aliases?); "
                            "write the values out instead")
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for k, v in node.value:
                sub = f"{path}.{k.value}" if path else str(k.value)
                if k.value in seen:
                    self.lines[sub] = k.start_mark.line + 1
                    self.fail(sub, "duplicate key")
                seen.add(k.value)
                self._index(v, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                self._index(v, f"{path}[{i}]")

    def fail(self, path: str, msg: str) -> None:
        line = self.lines.get(path)
        while line is None and path:
            path_parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", path)
            if path_parent == path:
                break
            path = path_parent
            line = self.lines.get(path)
        loc = f"{self.path}:{line}" if line else str(self.path)
        raise UserError(f"{loc}: {path or 'spec'}: {msg}")

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping with keys {', '.join(allowed)}")
        for key in value:
            if key not in allowed:
                hint = _closest(str(key), allowed)
                self.fail(f"{path}.{key}" if path else str(key),
                          f"unknown key '{key}'" + (f" (did you mean '{hint}'?)" if hint else "")
                          + f"; allowed: {', '.join(allowed)}")
        for key in required:
            if key not in value:
                self.fail(path, f"missing required key '{key}'")
        return value

    def shape(self, value: Any, path: str) -> tuple[int, ...]:
        if not isinstance(value, list):
            self.fail(path, "expected a list of dimension sizes, e.g. [1, 3, 224, 224]")
        for i, d in enumerate(value):
            if isinstance(d, str):
                self.fail(f"{path}[{i}]", f"dynamic dimension '{d}' is not bound: give its size as an integer")
            if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= DIM_MAX:
                self.fail(f"{path}[{i}]", f"dimension must be an integer from 0 to {DIM_MAX}, got {d!r}")
        return tuple(value)


def _closest(word: str, options: tuple[str, ...]) -> str | None:
    """The option a typo most likely meant: similar spelling, ties broken by a shared prefix."""
    import difflib
    import os.path

    def score(opt: str) -> tuple[float, float]:
        prefix = len(os.path.commonprefix([word.lower(), opt.lower()]))
        return prefix / max(len(word), 1), difflib.SequenceMatcher(None, word, opt).ratio()

    best = max(options, key=score, default=None)
    return best if best is not None and (score(best)[1] >= 0.6 or score(best)[0] >= 0.5) else None


def _number(r: _Reader, value: Any, path: str, lo: float = 0.0) -> float:
    """A finite number >= lo (YAML's .nan and .inf are floats too, and huge ints overflow one)."""
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= lo
    except OverflowError:
        ok = False
    if not ok:
        r.fail(path, f"expected a number >= {lo}, got {value!r}")
    return float(value)


def _section(top: dict, key: str, default: Any) -> Any:
    """An optional entry: `default` when absent or empty (`key:` or `key: ~`); any other value is
    checked as written, so `verify: false` is an error and not silently the defaults."""
    value = top.get(key)
    return default if value is None else value


def _path(r: _Reader, value: str | Path, field: str, base: Path | None, resolve: bool = True) -> Path:
    """A path field, relative to `base` (None: the current folder), with `~` expanded; one the
    operating system cannot take (no such user, NUL byte, name too long) is the spec's error."""
    try:
        p = Path(value).expanduser()
        p = base / p if base is not None else p
        return p.resolve() if resolve else p
    except RuntimeError:
        r.fail(field, f"cannot expand '~' in {str(value)!r}: no such user")
    except (OSError, ValueError) as e:
        r.fail(field, f"not a usable path {str(value)!r}: {getattr(e, 'strerror', None) or e}")
    raise AssertionError("unreachable")


def _is_file(r: _Reader, path: Path, field: str) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError) as e:
        r.fail(field, f"cannot open {str(path)!r}: {getattr(e, 'strerror', None) or e}")
    raise AssertionError("unreachable")


def _what_is(path: Path) -> str:
    """What a path that is not a regular file is, for the one-line error."""
    if path.is_dir():
        return "a folder"
    if path.exists():
        return "not a regular file (a FIFO, socket or device)"
    return "missing (model file not found)"


def load_spec(path: str | Path, output_override: str | Path | None = None) -> Spec:
    """Read and validate a spec file; raises UserError naming the file, line and field."""
    path = Path(path)
    r = _Reader(path, _read_text(path))
    top = r.mapping(r.data, "", ("name", "model", "output", "inputs", "profiles", "targets", "optimize", "verify",
                                 "onnxruntime"), required=("name", "model", "targets"))
    base = path.resolve().parent
    name, model, output = _files(r, top, base, output_override)
    inputs = _inputs(r, top)
    profiles = _profiles(r, top, inputs)
    targets = _targets(r, top)
    optimize = _optimize(r, top, base, [t.name for t in targets])
    raw_verify = r.mapping(_section(top, "verify", {}), "verify", ("rtol", "atol", "inputs", "reference"))
    reference = raw_verify.get("reference", "auto")
    if not (isinstance(reference, bool) or reference == "auto"):
        r.fail("verify.reference", f"expected true, false or auto (stored while under 16 MB), got {reference!r}")
    verify = VerifySpec(_number(r, raw_verify.get("rtol", 1e-4), "verify.rtol"),
                        _number(r, raw_verify.get("atol", 1e-5), "verify.atol"), _test_values(r, raw_verify),
                        reference)
    ort = _onnxruntime(r, top)
    return Spec(path.resolve(), name, model, output, inputs, profiles, targets, optimize, verify, ort, top, r)


def _read_text(path: Path) -> str:
    """The spec file as text: found, readable and UTF-8 (an optional BOM is fine)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: spec file not found") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the spec file: {getattr(e, 'strerror', None) or e}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        "save the spec as UTF-8") from None


def _test_values(r: _Reader, raw_verify: dict) -> dict:
    """verify.inputs: name -> a number or a (nested) list of numbers."""
    values = _section(raw_verify, "inputs", {})
    if not isinstance(values, dict):
        r.fail("verify.inputs", "expected a mapping: input name -> the value verify feeds it (a number or a list)")
    for name, value in values.items():
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError, OverflowError, RecursionError):   # ragged lists, mappings, deep nesting
            arr = np.asarray([None])
        if arr.dtype.kind not in "biuf":
            r.fail(f"verify.inputs.{name}", f"expected a number or a list of numbers, got {value!r}")
    return {str(k): v for k, v in values.items()}


def _files(r: _Reader, top: dict, base: Path, output_override) -> tuple[str, Path, Path]:
    """name, model file and output folder (relative to the spec; --output relative to the cwd)."""
    name = top["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        r.fail("name", f"package name must match {NAME_RE.pattern}, got {name!r}")
    if not isinstance(top["model"], str):
        r.fail("model", "expected the path of an ONNX file")
    model = _path(r, top["model"], "model", base)
    if not _is_file(r, model, "model"):
        r.fail("model", f"{model} is {_what_is(model)}, not an ONNX file; give the model file's path")
    out = output_override if output_override is not None else _section(top, "output", f"dist/{name}")
    if not isinstance(out, (str, Path)):
        r.fail("output", "expected a folder path")
    output = _path(r, out, "output", None if output_override is not None else base)
    return name, model, output


def _inputs(r: _Reader, top: dict) -> dict[str, InputSpec]:
    inputs: dict[str, InputSpec] = {}
    raw_inputs = _section(top, "inputs", {})
    if not isinstance(raw_inputs, dict):
        r.fail("inputs", "expected a mapping: input name -> {dtype, shape}")
    for iname, ival in raw_inputs.items():
        p = f"inputs.{iname}"
        ival = r.mapping(ival, p, ("dtype", "shape"), required=("shape",))
        dtype = ival.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            r.fail(f"{p}.dtype", f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        inputs[str(iname)] = InputSpec(str(iname), dtype, r.shape(ival["shape"], f"{p}.shape"))
    return inputs


def _profiles(r: _Reader, top: dict, inputs: dict[str, InputSpec]) -> list[Profile]:
    """The default profile (the inputs' shapes) and every named one (shapes it overrides)."""
    profiles = [Profile("default", {n: i.shape for n, i in inputs.items()})]
    raw_profiles = _section(top, "profiles", [])
    if not isinstance(raw_profiles, list):
        r.fail("profiles", "expected a list of {name, inputs}")
    for k, prof in enumerate(raw_profiles):
        p = f"profiles[{k}]"
        prof = r.mapping(prof, p, ("name", "inputs"), required=("name", "inputs"))
        pname = prof["name"]
        if not isinstance(pname, str) or not NAME_RE.fullmatch(pname):
            r.fail(f"{p}.name", f"profile name must match {NAME_RE.pattern}")
        if pname in {q.name for q in profiles}:
            r.fail(f"{p}.name", f"duplicate profile name '{pname}'")
        pin = r.mapping(prof["inputs"], f"{p}.inputs", tuple(inputs) or ("<inputs>",))
        shapes = {n: i.shape for n, i in inputs.items()}
        for iname, ival in pin.items():
            ival = r.mapping(ival, f"{p}.inputs.{iname}", ("shape",), required=("shape",))
            shapes[iname] = r.shape(ival["shape"], f"{p}.inputs.{iname}.shape")
        profiles.append(Profile(pname, shapes))
    return profiles


def _targets(r: _Reader, top: dict) -> list[TargetSpec]:
    """Target entries as written (packager/targets resolves them against the hardware table)."""
    raw_targets = top["targets"]
    if not isinstance(raw_targets, list) or not raw_targets:
        r.fail("targets", "expected a non-empty list of targets, e.g. [x86-64, arm64]")
    targets: list[TargetSpec] = []
    for k, t in enumerate(raw_targets):
        p = f"targets[{k}]"
        if isinstance(t, str):
            targets.append(TargetSpec(t, {}, p))
        else:
            t = r.mapping(t, p, ("name", "kind", "arch", "isa", "mcpu", "mattr", "sm", "host_arch", "rpc"), required=("name",))
            targets.append(TargetSpec(str(t["name"]), {k2: v for k2, v in t.items() if k2 != "name"}, p))
        if targets[-1].name in {x.name for x in targets[:-1]}:
            r.fail(p, f"target '{targets[-1].name}' is listed twice")
    return targets


def _optimize(r: _Reader, top: dict, base: Path, targets: list[str]) -> OptimizeSpec:
    raw_opt = r.mapping(_section(top, "optimize", {}), "optimize",
                        ("level", "passes", "scheduler", "tuning", "precision", "keep_fp32"))
    level = raw_opt.get("level", 2)
    if isinstance(level, bool) or not isinstance(level, int) or level not in LEVEL_PASSES:   # [] is unhashable
        r.fail("optimize.level", f"expected 0, 1, 2 or 3, got {level!r}")
    passes = r.mapping(_section(raw_opt, "passes", {}), "optimize.passes", PASS_NAMES)
    for pname, on in passes.items():
        if not isinstance(on, bool):
            r.fail(f"optimize.passes.{pname}", f"expected true or false, got {on!r}")
    scheduler = raw_opt.get("scheduler", "gensor")
    if scheduler not in ("gensor", "rules"):
        r.fail("optimize.scheduler", f"expected gensor or rules, got {scheduler!r}")
    tuning = r.mapping(_section(raw_opt, "tuning", {}), "optimize.tuning",
                       ("trials", "seconds", "database", "measure", "top_k", "budget"))
    counts = {}
    for key, default in (("trials", 0), ("top_k", 6)):
        value = tuning.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            r.fail(f"optimize.tuning.{key}", f"expected a non-negative integer, got {value!r}")
        counts[key] = value
    seconds, budget = tuning.get("seconds", 0), tuning.get("budget", OptimizeSpec.budget)
    for key, value in (("seconds", seconds), ("budget", budget)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            r.fail(f"optimize.tuning.{key}", f"expected a non-negative number of seconds, got {value!r}")
    measure = tuning.get("measure", True)
    if not isinstance(measure, bool):
        r.fail("optimize.tuning.measure", f"expected true or false, got {measure!r}")
    db = tuning.get("database")
    if db is not None and not isinstance(db, str):
        r.fail("optimize.tuning.database", "expected a folder path")
    db_path = _path(r, db, "optimize.tuning.database", base, resolve=False) if db else None
    return OptimizeSpec(level, dict(passes), counts["trials"], db_path, scheduler, measure, counts["top_k"],
                        float(seconds), float(budget), _precision(r, raw_opt, targets), _keep_fp32(r, raw_opt))


def _precision(r: _Reader, raw_opt: dict, named: list[str]) -> dict[str, str]:
    """optimize.precision: one precision for every target, or a mapping target name -> precision."""
    raw = raw_opt.get("precision", "fp32")
    chosen = {"*": raw} if not isinstance(raw, dict) else raw
    for target, value in chosen.items():
        where = "optimize.precision" + ("" if target == "*" else f".{target}")
        if target != "*" and target not in named:
            r.fail(where, f"'{target}' is not one of the spec's targets ({', '.join(named)})")
        if value not in PRECISIONS:
            r.fail(where, f"expected {', '.join(PRECISIONS)} (or a mapping target -> precision), got {value!r}")
    return dict(chosen)


def _keep_fp32(r: _Reader, raw_opt: dict) -> tuple[str, ...]:
    """optimize.keep_fp32: the ONNX op types a reduced-precision build keeps in fp32."""
    keep = raw_opt.get("keep_fp32", list(DEFAULT_KEEP_FP32))
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        r.fail("optimize.keep_fp32", "expected a list of ONNX op types, e.g. [LayerNormalization, Exp]")
    for k, op in enumerate(keep):
        if op not in KEEP_FP32_OPS:
            hint = _closest(op, KEEP_FP32_OPS)
            r.fail(f"optimize.keep_fp32[{k}]", f"'{op}' cannot be kept in fp32 by name"
                   + (f" (did you mean '{hint}'?)" if hint else "") + f"; choose from {', '.join(KEEP_FP32_OPS)} "
                   "(Softmax, the reductions and BatchNormalization are always fp32)")
    return tuple(keep)


def _onnxruntime(r: _Reader, top: dict) -> OrtSpec:
    raw_ort = r.mapping(_section(top, "onnxruntime", {}), "onnxruntime", ("fallback", "keep_ops", "keep_nodes"))
    fallback = raw_ort.get("fallback", True)
    if not isinstance(fallback, bool):
        r.fail("onnxruntime.fallback", f"expected true or false, got {fallback!r}")
    keep = {}
    for key in ("keep_ops", "keep_nodes"):
        value = _section(raw_ort, key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            r.fail(f"onnxruntime.{key}", "expected a list of names")
        keep[key] = tuple(value)
    return OrtSpec(fallback, keep["keep_ops"], keep["keep_nodes"])


def spec_error(spec: Spec, field_path: str, msg: str) -> UserError:
    """A UserError located at `field_path` of the spec (with its line when known)."""
    try:
        spec.reader.fail(field_path, msg)
    except UserError as e:
        return e
    raise AssertionError("unreachable")
