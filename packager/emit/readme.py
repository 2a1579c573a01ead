"""The package's README.md: how to run this package (CLI, C++, ONNX Runtime), from the template."""
from __future__ import annotations

import string

from .. import __version__
from ..codegen.backend import backend_for
from ..frontend import profile_shapes
from ..spec import Spec
from ..targets import Target, host_arch
from .manifest import source_sha256
from .runtime import data_dir


def _target_row(t: Target, folder: str) -> str:
    what = backend_for(t).readme_cell(t)
    return f"| {t.name} | {t.kind} | {t.arch} | {what} | `{folder}/{t.name}` |"


def package_readme(spec: Spec, model, targets: list[Target], ort_libs: dict, partial: bool) -> str:
    folder = "parts/*/targets" if partial else "targets"
    rows = "\n".join(_target_row(t, folder) for t in targets)
    io = ["| | name | dtype | shape (profile default) |", "|---|---|---|---|"]
    shapes = profile_shapes(model, spec.profiles[0])
    for i in model.inputs:
        io.append(f"| input | `{i.name}` | {i.dtype} | {list(shapes[i.name])} |")
    for o in model.outputs:
        io.append(f"| output | `{o.name}` | {o.dtype} | {list(o.shape)} |")
    example = " ".join(f"--input {i.name}={i.name}.npy" for i in model.inputs)
    feeds = ", ".join(f'"{i.name}": {i.name}_array' for i in model.inputs)
    arch = host_arch() if host_arch() in ort_libs else (next(iter(ort_libs), "x86_64"))
    note = ("This model is split: some nodes run in ONNX Runtime, the compiled parts (`parts/`) run through "
            "the custom op, so use it through ONNX Runtime (packrt-run and the C API run single parts, "
            "e.g. `parts/p0`)." if partial else
            "The whole model is compiled: ONNX Runtime only hands the tensors to the package.")
    tpl = string.Template((data_dir("templates") / "package_README.md").read_text())
    return tpl.substitute(name=spec.name, version=__version__, model_file=spec.model.name,
                          model_sha=source_sha256(spec.model)[:16], targets_table=rows,
                          io_table="\n".join(io), host_arch=targets[0].arch, example_inputs=example, feeds=feeds,
                          ort_arch=arch, ort_note=note)
