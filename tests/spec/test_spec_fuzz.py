"""Property-based fuzzing of the spec reader: whatever the file holds (random YAML documents, a
valid spec with one field broken, damaged text, random bytes), load_spec and then the targets'
resolution (the rest of what `pack build` checks in a spec alone) either give a well-formed Spec
and targets or raise a UserError of one non-empty line, never another exception.

Deterministic (derandomize=True): CI sees the same examples every run; on a failure hypothesis
prints the smallest document that triggers it."""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support.helpers import REPO
from packager.errors import UserError
from packager.spec import load_spec
from packager.spec.model import DTYPES, NAME_RE, PASS_NAMES, Spec
from packager.targets import resolve_all

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Every field the spec knows, so random documents hit the real checks and not only "unknown key".
TOP_KEYS = ["name", "model", "output", "inputs", "profiles", "targets", "optimize", "verify", "onnxruntime"]
NESTED_KEYS = ["dtype", "shape", "kind", "arch", "isa", "mcpu", "mattr", "sm", "host_arch", "level", "passes",
               "scheduler", "tuning", "trials", "seconds", "budget", "database", "measure", "top_k", "rtol", "atol", "fallback",
               "keep_ops", "keep_nodes", "image", "x", *PASS_NAMES]
WORDS = ["x86-64", "arm64", "x86-avx2", "cuda", "cpu", "sm_86", "float32", "int8", "gensor", "rules", "model.onnx",
         "dist/out", "default", "N", "~", "~nosuchuser/model.onnx", "", ".", "..", "/", "a" * 300, "x\0y",
         "line\nbreak", "tab\there", "\u2028", "caf\u00e9", *DTYPES]

FULL = {          # every section filled in, so mutations reach every check
    "name": "fuzz",
    "model": "model.onnx",
    "output": "dist/fuzz",
    "inputs": {"image": {"dtype": "float32", "shape": [1, 3, 8, 8]}, "x": {"shape": [4]}},
    "profiles": [{"name": "batch2", "inputs": {"image": {"shape": [2, 3, 8, 8]}}}],
    "targets": ["x86-64", {"name": "avx2", "kind": "cpu", "arch": "x86-64", "isa": "avx2"},
                {"name": "gpu", "kind": "cuda", "arch": "sm_86", "host_arch": "x86-64"}],
    "optimize": {"level": 1, "passes": {"fusion": False, "layout": True}, "scheduler": "rules",
                 "tuning": {"trials": 2, "database": "db", "measure": False, "top_k": 3}},
    "verify": {"rtol": 1e-3, "atol": 0, "inputs": {"x": [1, 2, 3, 4]}},
    "onnxruntime": {"fallback": False, "keep_ops": ["Softmax"], "keep_nodes": ["n0"]},
}
BASES = [FULL] + [yaml.safe_load((REPO / "samples" / s / "spec.yaml").read_text())
                  for s in ("cnn", "mlp", "transformer")]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-3, 5),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.sampled_from(WORDS))
keys = st.one_of(st.sampled_from(TOP_KEYS + NESTED_KEYS), st.text(max_size=10), st.integers(-2, 3), st.booleans())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=16)


def spec_like(draw_values=values):
    """A top-level mapping built from the real keys (each may be missing) with random values."""
    return st.fixed_dictionaries({}, optional={k: draw_values for k in TOP_KEYS}).flatmap(
        lambda d: st.dictionaries(keys, values, max_size=2).map(lambda extra: {**extra, **d}))


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every position in a parsed document, as a key/index path."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, prefix + (i,))
    return out


@st.composite
def mutated_spec(draw) -> Any:
    """A valid spec with one change: a field's value replaced (another type, a random string),
    a key deleted, an unknown key added, or a list entry duplicated."""
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    where = draw(st.sampled_from(paths(doc)))
    action = draw(st.sampled_from(["replace", "replace", "string", "delete", "add", "duplicate"]))
    if not where:
        return draw(values) if action == "replace" else doc
    parent = doc
    for step in where[:-1]:
        parent = parent[step]
    last = where[-1]
    if action == "replace":
        parent[last] = draw(values)
    elif action == "string":
        parent[last] = draw(st.text(max_size=40) | st.sampled_from(WORDS))
    elif action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent[last], dict):
        parent[last][draw(keys)] = draw(values)
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    return doc


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A spec folder with a model file (the reader only checks that it exists)."""
    root = tmp_path_factory.mktemp("specfuzz")
    (root / "model.onnx").write_bytes(b"placeholder")
    (root / "db").mkdir()
    return root


def check_outcome(path: Path) -> Spec | None:
    """load_spec's and resolve_all's result must be a well-formed Spec or a one-line UserError."""
    try:
        spec = load_spec(path)
        targets = resolve_all(spec)
    except UserError as e:
        msg = str(e)
        assert msg.strip(), "empty error message"
        assert len(msg.splitlines()) == 1 and "\n" not in msg and "\r" not in msg, msg
        return None
    assert isinstance(spec, Spec)
    assert isinstance(spec.name, str) and NAME_RE.fullmatch(spec.name), spec.name
    assert isinstance(spec.model, Path) and spec.model.is_file() and isinstance(spec.output, Path)
    for p in spec.profiles:
        assert all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for s in p.shapes.values() for d in s)
    assert len(targets) == len(spec.targets) and all(t.arch in ("x86_64", "aarch64") for t in targets)
    assert spec.optimize.level in (0, 1, 2, 3) and spec.optimize.scheduler in ("gensor", "rules")
    assert math.isfinite(spec.verify.rtol) and math.isfinite(spec.verify.atol)
    assert all(isinstance(v, str) for v in spec.onnxruntime.keep_ops + spec.onnxruntime.keep_nodes)
    return spec


def write_doc(folder: Path, doc: Any) -> Path:
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False))
    return path


def test_the_bases_are_valid(folder):
    """The mutations start from specs that load (else every mutation is trivially an error)."""
    for base in BASES:
        assert check_outcome(write_doc(folder, base)) is not None


@FUZZ
@given(doc=st.one_of(values, spec_like()))
def test_random_documents(folder, doc):
    check_outcome(write_doc(folder, doc))


@FUZZ
@given(doc=mutated_spec())
@example(doc={**FULL, "name": "fuzz\n"})                       # `$` in NAME_RE matched before a newline
@example(doc={**FULL, "model": "~nosuchuser/model.onnx"})      # expanduser() raised RuntimeError
@example(doc={**FULL, "model": "a" * 300})                     # is_file() raised ENAMETOOLONG
@example(doc={**FULL, "verify": {"rtol": float("nan")}})
@example(doc={**FULL, "inputs": {"line\nbreak": {"shape": [1]}}})
@example(doc={**FULL, "targets": [{"name": "a", "arch": "x86-64", "isa": [1]}]})   # TypeError: unhashable
@example(doc={**FULL, "targets": [{"name": "a", "arch": "arm64", "isa": {"x": 1}}]})
@example(doc={**FULL, "optimize": {"level": []}})                  # TypeError: unhashable (found by the full suite's fuzz run)
def test_mutated_valid_specs(folder, doc):
    check_outcome(write_doc(folder, doc))


ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]\n" for k in range(1, 9))


@st.composite
def damaged_text(draw) -> str:
    """A valid spec's YAML with a few characters inserted, deleted or replaced."""
    text = yaml.safe_dump(draw(st.sampled_from(BASES)), sort_keys=False)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        what = draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = draw(st.sampled_from(list(":-[]{}&*!|>'\"#%@`,?\t\n ")) | st.text(max_size=3))
        text = text[:i] + (chunk if what != "delete" else "") + text[i + (what != "insert"):]
    return text


@FUZZ
@given(text=st.one_of(damaged_text(), st.text(max_size=200)))
@example(text="[" * 5000 + "]" * 5000)                        # nesting past the recursion limit
@example(text=ALIAS_BOMB)                                     # 9^9 entries: hung indexing line numbers
@example(text="name: x\nmodel: model.onnx\ntargets: [x86-64]\n? [a, b]\n: 1\n")   # unhashable key
@example(text="--- {name: x}\n--- {name: y}\n")
def test_damaged_text(folder, text):
    path = folder / "spec.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    check_outcome(path)


@FUZZ
@given(data=st.binary(max_size=200))
@example(data=b"name: caf\xe9\n")                             # Latin-1, not UTF-8
@example(data=b"\xff\xfe" + "name: x\n".encode("utf-16-le"))
@example(data=b"name: x\x00\n")
def test_random_bytes(folder, data):
    path = folder / "spec.yaml"
    path.write_bytes(data)
    check_outcome(path)
