"""The deployment spec as typed objects (what load.py produces from the YAML): the rest of the
packager reads only these."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


DTYPES = ("float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
PASS_NAMES = ("simplify", "fastmath", "fusion", "global_fusion", "schedule", "derive", "layout", "reuse",
              "reuse_same", "bridges", "pad_channels", "concat_in_place", "int8", "winograd", "window_rows",
              "pad_inline", "half_blocks", "cold_heavy")
# Which passes each optimize.level turns on by default (a `passes:` entry overrides it).
# Level 1 ("safe") keeps results bit-identical to TVM's exact math; level 2 adds approximations;
# level 3 adds the measured tuner and ETO's reuse (level 2's top-k with reuse swung BERT-base's
# latency from 1.0x to 1.9x onnxruntime between cold builds; the tuner after it re-searches).
# reuse_same (level 2 on) reuses only a measured program of the exact same workload.
# pad_channels (level 2 on, part of `layout`): a conv may compute its output channels padded to
# whole vector blocks (layout/pad.py), carried on through depthwise convs into the next conv. concat_in_place (level 1 on: it moves no value): a concat's
# producers write their slices of its output, and the copy kernel is dropped (emit/in_place.py).
# winograd (level 2 on): a 3x3 stride-1 conv computed as Winograd F(4x4) or F(2x2) where timing on
# the build machine says it is faster (optimize/winograd); untimed targets keep the direct conv.
# int8 (level 2 on): a QDQ model's matmuls and convs with 8-bit weights sum in int32 (optimize/int8.py),
# which is what onnxruntime computes; the float path rounds every partial sum.
# window_rows (level 1 on: the same sums in the same order): kernels of few products per output
# (depthwise convs, pooling, 1x1 convs from few channels) are also offered register-blocked rows of
# output positions (schedule/gensor/window.py), timed beside the walk's plans (CPU targets).
# half_blocks (level 2 on, part of `layout`): tensors whose channels whole vectors do not divide
# may take half-vector blocks (NCHW8c on AVX-512; layout/search.py half_block).
# cold_heavy (level 1 on: it changes which program is chosen, not what it computes): kernels whose
# weights outweigh their activations are timed with the caches flushed before every run, as the
# model leaves their weights (schedule/hardware.py weight_heavy; CPU targets timed here).
# pad_inline (level 1 on: the same sums): depthwise convs and pooling over NCHW{c} may read their
# padding inline, each read testing its bounds, instead of copying padded rows (schedule/rules/padding.py).
LEVEL_PASSES = {
    0: set(),
    1: {"simplify", "fusion", "schedule", "concat_in_place", "window_rows", "pad_inline", "cold_heavy"},
    2: {"simplify", "fastmath", "fusion", "global_fusion", "schedule", "derive", "layout", "reuse_same",
        "pad_channels", "concat_in_place", "int8", "winograd", "window_rows", "pad_inline", "half_blocks",
        "cold_heavy"},
    3: {"simplify", "fastmath", "fusion", "global_fusion", "schedule", "derive", "layout", "reuse", "reuse_same",
        "bridges", "pad_channels", "concat_in_place", "int8", "winograd", "window_rows", "pad_inline", "half_blocks",
        "cold_heavy"},
}
# optimize.precision: what a target's convs and matmuls compute in (optimize/precision.py).
PRECISIONS = ("fp32", "fp16", "bf16")
# optimize.keep_fp32: ONNX op types that may be pinned to fp32 in a reduced-precision build, and
# the default list (normalizations, exp/log/pow, sqrt, global average pooling).
KEEP_FP32_OPS = ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization", "Exp",
                 "Log", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Div", "Gelu", "AveragePool", "GlobalAveragePool")
DEFAULT_KEEP_FP32 = ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization", "Exp",
                     "Log", "Pow", "Sqrt", "GlobalAveragePool")
# The verify tolerance a reduced-precision target is held to at least (rtol, atol): fp16 keeps 11
# significant bits, bf16 8, and their rounding compounds through the layers.
PRECISION_TOLERANCE = {"fp32": (0.0, 0.0), "fp16": (1e-2, 1e-3), "bf16": (5e-2, 1e-2)}
# Package and profile names; check with fullmatch (`$` also matches before a final newline).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DIM_MAX = 2**63 - 1                 # ONNX and the runtime store dims as int64


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str | None          # None: take the model's dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One set of static input shapes; each profile is compiled to its own plan."""

    name: str
    shapes: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class TargetSpec:
    """A target as written in the spec; `targets.resolve` turns it into a concrete target."""

    name: str
    fields: dict[str, Any]
    where: str                 # "targets[2]" for error messages


@dataclass(frozen=True)
class OptimizeSpec:
    level: int = 2
    passes: dict[str, bool] = field(default_factory=dict)
    trials: int = 0                    # measured tuning's budget per model in programs timed (0: level 3's default)
    database: Path | None = None
    scheduler: str = "gensor"          # "gensor" (construction-based) | "rules" (the spine's rule-based)
    measure: bool = True               # time the top-k schedules where the target runs (here or its rpc device)
    top_k: int = 6                     # candidates measured per kernel
    seconds: float = 0.0               # measured tuning's budget per model in wall time (0: none)
    budget: float = 0.0                # seconds of candidate timing per build (0: no cap; not when tuning); past it, one repeat each
    precision: dict[str, str] = field(default_factory=dict)   # target ("*": every one) -> fp32|fp16|bf16
    keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32             # ONNX op types a reduced-precision build keeps fp32

    def precision_of(self, target: str) -> str:
        """The precision `target` computes its convs and matmuls in (fp32 unless the spec says)."""
        return self.precision.get(target, self.precision.get("*", "fp32"))

    def reduced(self) -> bool:
        """Whether any target computes in less than fp32."""
        return any(p != "fp32" for p in self.precision.values())

    def tunes(self) -> bool:
        """Whether the measured tuner runs (level 3, or a budget given)."""
        return self.level >= 3 or bool(self.trials) or bool(self.seconds)

    def enabled(self, name: str) -> bool:
        """Whether pass `name` runs: an explicit switch wins over the level's default."""
        return self.passes.get(name, name in LEVEL_PASSES[self.level])


@dataclass(frozen=True)
class OrtSpec:
    """What runs in ONNX Runtime instead of being compiled (partial offload)."""

    fallback: bool = True              # unsupported ops stay in ONNX Runtime (false: they fail the build)
    keep_ops: tuple[str, ...] = ()     # op types always left to ONNX Runtime
    keep_nodes: tuple[str, ...] = ()   # node names always left to ONNX Runtime

    @property
    def partial(self) -> bool:
        return self.fallback or bool(self.keep_ops) or bool(self.keep_nodes)


@dataclass(frozen=True)
class VerifySpec:
    rtol: float = 1e-4
    atol: float = 1e-5
    # input name -> the value verify and bench feed it instead of seeded random data (a sample
    # rate, a flag, token ids in range), broadcast to each profile's shape; JSON-able as written
    inputs: dict = field(default_factory=dict)
    # store seeded inputs and onnxruntime's outputs in the package (packrt-run --check):
    # "auto" while they stay under 16 MB, True always, False never
    reference: bool | str = "auto"

    def tolerance(self, precision: str = "fp32") -> tuple[float, float]:
        """(rtol, atol) for a target computing in `precision`: the spec's, widened to what the
        precision can hold (PRECISION_TOLERANCE)."""
        rtol, atol = PRECISION_TOLERANCE[precision]
        return max(self.rtol, rtol), max(self.atol, atol)


@dataclass(frozen=True)
class Spec:
    path: Path
    name: str
    model: Path
    output: Path
    inputs: dict[str, InputSpec]
    profiles: list[Profile]
    targets: list[TargetSpec]
    optimize: OptimizeSpec
    verify: VerifySpec
    onnxruntime: OrtSpec
    raw: dict[str, Any]
    reader: Any = field(repr=False, compare=False)
