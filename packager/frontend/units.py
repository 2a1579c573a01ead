"""What gets compiled: the whole model as one unit, or (partial offload) one unit per compiled
part, each with its shape profiles."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..spec import Spec
from .model import LoadedModel, profile_shapes
from .partition import Partition, part_loaded, partition, tensor_types

@dataclass(frozen=True)
class Unit:
    """A model to compile and where its files go inside the package."""

    name: str                                     # "" for the whole model, "p0", ... for parts
    rel: str                                      # folder inside the package ("" or "parts/p0")
    model: LoadedModel
    profiles: list[tuple[str, dict[str, tuple[int, ...]]]]   # (profile name, input shapes)
    dtypes: dict[str, str]

    def path(self, rel: str) -> str:
        return f"{self.rel}/{rel}" if self.rel else rel


def split_units(spec: Spec, model: LoadedModel, dtypes: dict[str, str]) -> tuple[list[Unit], Partition | None, list]:
    """The whole model as one unit, or (partial offload) one unit per compiled part; with the
    partition and, per profile, every tensor's inferred dtype and shape."""
    profiles = [(p.name, profile_shapes(model, p)) for p in spec.profiles]
    if not spec.onnxruntime.partial:
        return [Unit("", "", model, profiles, dtypes)], None, []
    types = [tensor_types(model, shapes) for _, shapes in profiles]
    split = partition(model, types, spec.onnxruntime.keep_ops, spec.onnxruntime.keep_nodes)
    if split.whole:
        return [Unit("", "", model, profiles, dtypes)], None, types
    if not split.parts:
        raise UserError(f"{spec.model}: nothing left to compile: every node stays in ONNX Runtime "
                        f"({len(split.kept)} node(s)): {_reasons(model, split)}")
    units = []
    for part in split.parts:
        sub = part_loaded(model, part, types)
        shapes = [(pname, {i: tuple(t[i][1]) for i in part.inputs}) for (pname, _), t in zip(profiles, types)]
        units.append(Unit(part.name, f"parts/{part.name}", sub, shapes, {i: types[0][i][0] for i in part.inputs}))
    return units, split, types


def _reasons(model: LoadedModel, split: Partition, limit: int = 3) -> str:
    """Why the first nodes stay in ONNX Runtime, e.g. "bn0 (BatchNormalization): is in training mode"."""
    nodes = model.proto.graph.node
    said = [f"{nodes[k].name or f'#{k}'} ({nodes[k].op_type}): {split.reasons.get(k, 'kept')}" for k in split.kept[:limit]]
    return "; ".join(said) + ("; ..." if len(split.kept) > limit else "")
