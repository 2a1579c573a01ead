"""The CUDA backend (a100, v100, orin, h100, any sm_XX): kernels -> CUDA C + one fatbin per target,
built offline; packrt-run runs it on a local GPU of the same or a newer architecture."""
from __future__ import annotations

from typing import Any

from ..targets import CudaTarget, host_arch, local_cuda_sm
from .backend import Compiled
from ..optimize.schedule.phases import phase_sizes
from .cuda_grid import GridReport, cooperative_launches, join_phases
from .cuda_source import CudaKernel, CudaModule, generate_cuda
from .opencl import opencl_emulation
from .cuda_toolchain import check_cuda_toolchain, compile_fatbin


class CudaBackend:
    kind = "cuda"

    def check_toolchain(self, targets: list[CudaTarget]) -> None:
        check_cuda_toolchain(min(t.sm_number for t in targets))

    def compile(self, kernels: dict, target: CudaTarget, folder: str, w) -> Compiled:
        cm = generate_cuda(kernels, target)
        unjoined = CudaModule(cm.source, {n: CudaKernel(list(k.launches), list(k.workspace))
                                          for n, k in cm.kernels.items()})
        fatbin = w.path(f"{folder}/kernels.fatbin")
        phased = {name for name, f in kernels.items() if phase_sizes(f) is not None}
        grid = GridReport()
        while True:               # again without a joined kernel that turns out not to be co-resident
            source, joined, refused = join_phases(cm, phased)
            compiler = compile_fatbin(source, target.sm, fatbin)
            grid = GridReport(refused={**grid.refused, **refused})
            cooperative = cooperative_launches(joined, fatbin, target.facts, target.sm_number, grid)
            if len(cooperative) == len(joined):
                break
            phased -= set(joined) - set(cooperative)
        for name, launch in cooperative.items():
            cm.kernels[name].launches = [launch]
        w.write_text(f"{folder}/kernels.cu", source)
        emulated = _write_emulation(kernels, unjoined, set(cooperative), target, folder, w)
        launches = {name: {"launches": [ln.as_dict() for ln in k.launches], "workspace": k.workspace}
                    for name, k in cm.kernels.items()}
        table = [(name, cm.kernels[name].launches[0].function, len(f.params)) for name, f in kernels.items()]
        info = {"compiler": compiler, "device_functions": sum(len(k.launches) for k in cm.kernels.values()),
                "source_bytes": len(source), "grid_sync": grid.as_dict(), "emulation": emulated}
        return Compiled(table, launches, {"cuda": info}, f", {compiler} for {target.sm}{grid.note()}")

    def plan_fields(self) -> dict[str, Any]:
        return {"module": "kernels.fatbin"}

    def manifest_files(self, folder: str) -> dict[str, str]:
        return {"kernels": f"{folder}/kernels.fatbin", "source": f"{folder}/kernels.cu",
                "emulation": f"{folder}/{EMULATION_FOLDER}/emulation.json"}

    def readme_cell(self, target: CudaTarget) -> str:
        return f"{target.sm} (kernels.fatbin + kernels.cu)"

    def inspect_line(self, report: dict[str, Any]) -> str:
        cu = report.get("cuda", {})
        coop = cu.get("grid_sync", {}).get("cooperative_kernels", 0)
        return (f"CUDA {report['sm']} ({report['arch']} host), {cu.get('compiler', '?')}, "
                f"{cu.get('device_functions', '?')} device functions" + (f" ({coop} cooperative)" if coop else ""))

    def runner(self, pkg, target: dict[str, Any]) -> tuple[list[str] | None, str]:
        arch = target["arch"]
        cli = str(pkg.cli(arch))
        if arch != host_arch():
            return None, f"its runtime is built for an {arch} host (e.g. the Jetson itself), this machine is {host_arch()}"
        sm, why = local_cuda_sm()
        if sm is None:
            return None, why
        want = int(str(target["sm"]).split("_")[1])
        if sm < want:
            return None, f"needs a GPU of {target['sm']} or newer, this one is sm_{sm}"
        return [cli], ""

    def reference_on_gpu(self) -> bool:
        return True

    def emulated(self) -> bool:
        return True

    def roofline_peaks(self, target: dict[str, Any], threads: int) -> tuple[float, float]:
        """Datasheet peaks of the GPU (threads do not apply)."""
        return target.get("fp32_tflops", 10.0) * 1e3, target.get("dram_gbs", 1000.0)


EMULATION_FOLDER = "emulation"


def _write_emulation(kernels: dict, unjoined: CudaModule, cooperative: set[str], target: CudaTarget, folder: str,
                     w) -> dict[str, Any]:
    """The same kernels as OpenCL C (codegen/opencl.py) for `pack verify --gpu-emulate`; the
    build report's summary of it."""
    source, doc = opencl_emulation(kernels, unjoined, cooperative, f"target '{target.name}' (OpenCL emulation)")
    w.write_text(f"{folder}/{EMULATION_FOLDER}/kernels.cl", source)
    w.write_json(f"{folder}/{EMULATION_FOLDER}/emulation.json", doc)
    refused = {n: k["reason"] for n, k in doc["kernels"].items() if not k["emulated"]}
    return {"kernels": len(kernels), "emulated": len(kernels) - len(refused), "not_emulated": refused}


BACKEND = CudaBackend()
