"""`pack gpu-suite BUNDLE`: the build-host half of a suite that checks GPU targets where they run.

Builds the samples and a few zoo models small enough to travel (the whole bundle under 60 MB) for
the given targets (default h100 and a100: an a100 fatbin runs on an H100 through its PTX, which
exercises the driver's JIT), with their reference data, and keeps only what runs on the device:
each package's manifest, reference/ and the targets' folders; one x86_64 packrt-run and
libpackrt.so for the whole bundle (bin/, lib/); device.py (gpu_suite_device.py, the device half:
numpy + PyTorch only) and models.py (samples/zoo/models.py, for the PyTorch baseline). With CPU
targets (`--targets x86-64`) the same bundle runs anywhere, which is how CI tests both halves.
Corpus models (`pack corpus --list`: third-party ONNX files) can be named too; they are checked
against onnxruntime's outputs, with no PyTorch baseline. A name in both tables (mobilenet_v2) means
the zoo model, which has the PyTorch baseline; `corpus:<name>` asks for the corpus one.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

import yaml

from .. import __version__
from ..errors import UserError
from ..spec.model import PRECISIONS
from .corpus_fetch import first_line
from .corpus_models import ENTRIES

REPO = Path(__file__).resolve().parents[2]
SAMPLES = ["mlp", "cnn", "transformer"]
# zoo models for the bundle: samples/zoo/make_zoo.py ZOO entries (bert_mini: a small BERT;
# speech_rnn: recurrent loop kernels)
ZOO = ["mobilenet_v2", "vit_tiny", "bert_mini", "speech_rnn"]
DEFAULT_TARGETS = ["h100", "a100"]
LIMIT_MB = 60


def build_bundle(bundle: Path, models: list[str] | None = None, targets: list[str] | None = None,
                 zoo_targets: list[str] | None = None, log=print, precision: str = "fp32") -> dict:
    """Builds every model into a package and assembles the bundle; returns suite.json's content
    (a model whose build fails is listed under `not_built` with its error, and the rest go on).
    Zoo models get `zoo_targets` (default: the first target only, so the weights travel once)."""
    from ..build import build
    from ..spec import load_spec

    models = models or SAMPLES + ZOO
    targets = targets or DEFAULT_TARGETS
    zoo_targets = zoo_targets or targets[:1]
    zoo = set(ZOO) | set(_zoo_table())
    unknown = sorted(m for m in models if m not in SAMPLES and m not in zoo and _corpus_name(m) not in ENTRIES)
    if precision not in PRECISIONS:
        raise UserError(f"gpu-suite: --precision {precision}: expected one of {', '.join(PRECISIONS)}")
    if unknown:
        raise UserError(f"gpu-suite: unknown model(s) {', '.join(unknown)}; choose from {', '.join(SAMPLES + ZOO)} "
                        "or a corpus model (`pack corpus --list`)")
    bundle = Path(bundle).resolve()
    if bundle.exists() and not (bundle / "suite.json").is_file():
        raise UserError(f"{bundle} exists and is not a GPU suite bundle; remove it or choose another folder")
    shutil.rmtree(bundle, ignore_errors=True)
    (bundle / "packages").mkdir(parents=True)
    suite = {"format": "packager-gpu-suite", "version": 1, "packager_version": __version__, "precision": precision,
             "models": [], "not_built": []}
    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
        for name in models:
            folder = name.replace(":", "-")             # corpus:mobilenet_v2 -> corpus-mobilenet_v2
            is_zoo = name not in SAMPLES                # zoo and corpus models carry weights: first target
            make = _sample_spec if not is_zoo else _zoo_spec if name in zoo else _corpus_spec
            log(f"gpu-suite: building {name} for {', '.join(zoo_targets if is_zoo else targets)}")
            try:          # an export that fails (a corpus model's) is this model's failure too
                spec_path, torch_info = make(_corpus_name(name), Path(tmp), zoo_targets if is_zoo else targets)
                _set_precision(spec_path, precision)
                pkg = build(load_spec(spec_path), log=lambda m: None)
                kinds = _keep(pkg, bundle / "packages" / folder)
            except Exception as e:  # noqa: BLE001 - one model that does not build must not cost the rest
                shutil.rmtree(bundle / "packages" / folder, ignore_errors=True)
                suite["not_built"].append({"name": name, "error": first_line(e)})
                log(f"gpu-suite: {name} NOT BUILT: {first_line(e)}")
                continue
            _runtime(pkg, bundle)
            suite["models"].append({"name": name, "package": f"packages/{folder}", "targets": kinds,
                                    "torch": torch_info})
    shutil.copy2(Path(__file__).with_name("gpu_suite_device.py"), bundle / "device.py")
    shutil.copy2(REPO / "samples" / "zoo" / "models.py", bundle / "models.py")
    (bundle / "suite.json").write_text(json.dumps(suite, indent=1) + "\n")
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) / 2**20
    suite["megabytes"] = round(size, 1)
    (bundle / "suite.json").write_text(json.dumps(suite, indent=1) + "\n")
    log(f"gpu-suite: wrote {bundle} ({size:.1f} MB{'' if size < LIMIT_MB else f', OVER the {LIMIT_MB} MB carry'}); "
        f"on the device: python {bundle.name}/device.py")
    return suite


def _set_precision(spec_path: Path, precision: str) -> None:
    """The suite spec asks for `precision` (fp32: the spec as it is)."""
    if precision != "fp32":
        spec = yaml.safe_load(spec_path.read_text())
        spec.setdefault("optimize", {})["precision"] = precision
        spec_path.write_text(yaml.safe_dump(spec))


def _corpus_name(name: str) -> str:
    """`corpus:mobilenet_v2` -> `mobilenet_v2`: a corpus model asked for by its prefixed name."""
    return name.removeprefix("corpus:")


def _sample_spec(name: str, tmp: Path, targets: list[str]) -> tuple[Path, None]:
    """samples/<name>/spec.yaml with the suite's targets and a scratch output folder; the model is
    written afresh (samples/make_samples.py, deterministic), so a checkout needs no generated files."""
    (model,) = _script("make_samples.py").write_samples([name], root=tmp / "samples")
    return _suite_spec(REPO / "samples" / name / "spec.yaml", model, targets, tmp, name), None


def _zoo_table() -> dict:
    return _script("zoo/make_zoo.py").ZOO


def _zoo_spec(name: str, tmp: Path, targets: list[str]) -> tuple[Path, dict]:
    """Exports the zoo model (samples/zoo/make_zoo.py, seed 0) with the suite's targets."""
    make_zoo = _script("zoo/make_zoo.py")
    model = make_zoo.export(name, tmp / "zoo")
    ctor, _, _, kind, _ = make_zoo.ZOO[name]
    return (_suite_spec(model.parent / "spec.yaml", model, targets, tmp, name),
            {"ctor": ctor, "kwargs": make_zoo.KWARGS.get(name, {}), "seed": 0, "init_transformer": kind != "float"})


def _corpus_spec(name: str, tmp: Path, targets: list[str]) -> tuple[Path, None]:
    """The corpus model's default spec (`pack corpus`: its bound inputs and tolerance) with the
    suite's targets; the model is fetched into the corpus cache on first use."""
    from .corpus import select, write_spec
    from .corpus_fetch import fetch

    (entry,) = select([name])
    path = write_spec(entry, fetch(entry), tmp / "corpus" / name, target=targets[0])
    return _suite_spec(path, Path(yaml.safe_load(path.read_text())["model"]), targets, tmp, name), None


def _script(rel: str):
    """A script under samples/ (make_samples.py, zoo/make_zoo.py) as a module."""
    path = REPO / "samples" / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _suite_spec(source: Path, model: Path, targets: list[str], tmp: Path, name: str) -> Path:
    """The spec at `source` for `model`, with the suite's targets and a scratch output folder."""
    spec = yaml.safe_load(source.read_text())
    spec.update(model=str(model), targets=targets, output=str(tmp / "out" / name))
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _keep(pkg: Path, dst: Path) -> dict[str, str]:
    """What runs on the device: manifest, reference data, the targets' folders. Returns target -> kind."""
    m = json.loads((pkg / "manifest.json").read_text())
    if "targets" not in m:
        raise UserError(f"{pkg}: parts of the model run in ONNX Runtime; the suite takes whole-model packages only")
    if "reference" not in m:
        raise UserError(f"{pkg}: no reference data was stored (over 16 MB?); the suite needs it to check the package")
    dst.mkdir(parents=True)
    shutil.copy2(pkg / "manifest.json", dst / "manifest.json")
    shutil.copytree(pkg / "reference", dst / "reference")
    for t in m["targets"]:
        shutil.copytree(pkg / t["path"], dst / t["path"])
    return {t["name"]: t["kind"] for t in m["targets"]}


def _runtime(pkg: Path, bundle: Path) -> None:
    """One packrt-run and libpackrt.so (x86_64) for the bundle."""
    m = json.loads((pkg / "manifest.json").read_text())
    rt = m.get("runtime", {}).get("x86_64")
    if rt is None:
        raise UserError(f"{pkg}: no x86_64 runtime in the package; the suite runs on an x86_64 device host")
    for key, folder in (("cli", "bin"), ("library", "lib")):
        (bundle / folder).mkdir(exist_ok=True)
        shutil.copy2(pkg / rt[key], bundle / folder / Path(rt[key]).name)
