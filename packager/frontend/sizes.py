"""What a profile needs in memory, estimated from the bound shapes before anything is compiled.

A batch bound to 10^9 used to fail a minute into the build, as an internal MemoryError where the
reference data was made. The estimate is a lower bound: the weights, the inputs and outputs, and
the largest intermediate tensor ONNX shape inference finds (the arena holds at least that). The
build computes the reference outputs on this machine, and the package's runtime holds the same on
the target, so a profile whose estimate exceeds this machine's memory is refused in one line.
"""
from __future__ import annotations

import math
import os

import numpy as np
import onnx
from onnx import helper

from ..errors import UserError
from ..spec import Spec
from .model import LoadedModel, profile_shapes, weight_bytes
from .shapes import infer_shapes


def check_sizes(spec: Spec, model: LoadedModel, dtypes: dict[str, str]) -> None:
    """Refuse a profile whose tensors cannot fit this machine's memory (see the module doc)."""
    limit = host_memory()
    weights = weight_bytes(model.proto)
    for prof in spec.profiles:
        shapes = profile_shapes(model, prof)
        inputs = {n: math.prod(s) * _itemsize(dtypes[n]) for n, s in shapes.items()}
        if weights + sum(inputs.values()) <= limit:
            tensors = _tensor_bytes(infer_shapes(model, shapes, strict=False, keep_weights=False))
            outputs = sum(tensors.get(o.name, 0) for o in model.outputs)
            largest = max(((b, n) for n, b in tensors.items() if n not in inputs), default=(0, ""))
        else:
            outputs, largest = 0, (0, "")
        need = weights + sum(inputs.values()) + outputs + largest[0]
        if need > limit:
            big = max(inputs.items(), key=lambda kv: kv[1])
            parts = [f"inputs {human_size(sum(inputs.values()))} ({big[0]}: {human_size(big[1])})"]
            if outputs:
                parts.append(f"outputs {human_size(outputs)}")
            if largest[0]:
                parts.append(f"the largest intermediate tensor {human_size(largest[0])} ('{largest[1]}')")
            parts.append(f"weights {human_size(weights)}")
            raise UserError(f"{spec.path}: profile '{prof.name}' needs at least {human_size(need)} ({', '.join(parts)}), "
                            f"more than this machine's {human_size(limit)} of memory, which computes its reference "
                            "outputs; bind smaller shapes in the spec's inputs")


def host_memory() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _tensor_bytes(inferred: onnx.ModelProto) -> dict[str, int]:
    """Bytes of every tensor whose static shape inference found."""
    out = {}
    for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        t = v.type.tensor_type
        if t.elem_type and t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[v.name] = math.prod(d.dim_value for d in t.shape.dim) * _itemsize(t.elem_type)
    return out


def _itemsize(dtype: str | int) -> int:
    """Bytes per element of a dtype name ("float32") or an ONNX element type."""
    return (helper.tensor_dtype_to_np_dtype(dtype) if isinstance(dtype, int) else np.dtype(dtype)).itemsize


def human_size(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    k = 0
    while n >= 1024 and k < len(units) - 1:
        n, k = n / 1024, k + 1
    return f"{n:.0f} B" if k == 0 else f"{n:.2f} {units[k]}"
