"""What a device kind is, answered in one place: the Backend interface and the table of backends.

Every question whose answer depends on the kind of device (its toolchain, how kernels become the target's artifact, what the plan and manifest say about them,
how verify and bench run it, where its roofline is) is a method here; the build, the emitters
and the tools ask the backend of a target's `kind` and never branch on it. Adding a device kind
is one module with a `BACKEND` object plus a row in `BACKEND_MODULES`, a row in
optimize/pipeline.py's `PIPELINES` (its graph and kernel passes) and its scheduler
(optimize/schedule/registry.py: the scheduling contract the passes call).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import tvm

    from ..emit.manifest import PackageInfo
    from ..emit.package import PackageWriter
    from ..targets import Target

# kind -> module holding its BACKEND (imported on first use: `pack verify` needs no TVM).
BACKEND_MODULES = {"cpu": "packager.codegen.cpu", "cuda": "packager.codegen.cuda"}


@dataclass
class Compiled:
    """A target's kernels after compilation: the plan's kernel table [(name, symbol, num_args)],
    extra plan fields per kernel (e.g. GPU launches), extra build-report fields, and a note for
    the build log."""

    table: list[tuple[str, str, int]]
    kernel_fields: dict[str, dict] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    log_note: str = ""


class Backend(Protocol):
    kind: str

    def check_toolchain(self, targets: list[Target]) -> None:
        """Fail with a UserError before anything is compiled if these targets cannot be built here."""

    def compile(self, kernels: dict[str, tvm.tirx.PrimFunc], target: Target, folder: str,
                w: PackageWriter) -> Compiled:
        """Write the target's kernel artifact(s) under `folder` of the package."""

    def plan_fields(self) -> dict[str, Any]:
        """Fields the plan document adds for this kind."""

    def manifest_files(self, folder: str) -> dict[str, str]:
        """The manifest target entry's kernel file(s), relative to the unit's folder."""

    def readme_cell(self, target: Target) -> str:
        """What the package README's target table says about a target's code."""

    def inspect_line(self, report: dict[str, Any]) -> str:
        """`pack inspect`'s description of a target from its build-report row."""

    def runner(self, pkg: PackageInfo, target: dict[str, Any]) -> tuple[list[str] | None, str]:
        """The command prefix that runs packrt-run for this manifest target here, or None and why not."""

    def reference_on_gpu(self) -> bool:
        """Whether verify/bench compare it with onnxruntime's CUDA EP (else the CPU EP)."""

    def emulated(self) -> bool:
        """Whether the package carries its kernels in a form the CPU runs (`pack verify --gpu-emulate`)."""

    def roofline_peaks(self, target: dict[str, Any], threads: int) -> tuple[float, float]:
        """(peak GFLOP/s, peak GB/s) of a manifest target running with `threads`."""


def backend_for(what: str | Target | dict) -> Backend:
    """The backend of a kind name, a target, or a manifest/report target entry."""
    kind = what if isinstance(what, str) else what["kind"] if isinstance(what, dict) else what.kind
    module = BACKEND_MODULES.get(kind)
    if module is None:
        raise ValueError(f"no backend for device kind '{kind}' (known: {', '.join(BACKEND_MODULES)})")
    return importlib.import_module(module).BACKEND


def check_toolchains(targets: list[Target]) -> None:
    """Every target's toolchain, asked of its kind's backend once for all targets of that kind."""
    for kind in dict.fromkeys(t.kind for t in targets):
        backend_for(kind).check_toolchain([t for t in targets if t.kind == kind])
