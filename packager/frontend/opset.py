"""Any opset onnxruntime runs -> the opsets the packager compiles (OPSET_MIN-OPSET_MAX).

A model outside the range is moved to the nearest end of it: a newer one is relabelled when every
node means the same there (opset 22+ re-versioned many ops only to add types), anything else is
converted with onnx.version_converter. A conversion is then checked against the original in onnxruntime on
seeded inputs of the spec's first profile (check_conversion); one that changes results is a
clear error, and the build report says what was done.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..errors import UserError
from .attrs import all_graphs

OPSET_MIN, OPSET_MAX = 11, 21          # what TVM's importer and our rewrites are tested on
ONNXRUNTIME_MIN_OPSET = 7              # the oldest default-domain opset onnxruntime runs


@dataclass
class OpsetConversion:
    """What load_model did to the model's opset, and (after check_conversion) how it was checked."""

    source: int
    target: int
    how: str                           # "relabelled" | "onnx.version_converter"
    check: str = "not checked"

    def summary(self) -> str:
        return f"opset {self.source} -> {self.target} ({self.how}); {self.check}"


def default_opset(proto: onnx.ModelProto) -> int | None:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def same_contract(node: onnx.NodeProto, old, new) -> bool:
    """Whether `node` means the same under two schema versions: same inputs/outputs, and every
    attribute it sets exists in both (an attribute added later, left at its default, does not
    change the node)."""
    ios = [[(p.name, p.option) for p in list(s.inputs) + list(s.outputs)] for s in (old, new)]
    return ios[0] == ios[1] and all(a.name in old.attributes and a.name in new.attributes for a in node.attribute)


def relabel(model: onnx.ModelProto, target: int) -> str | None:
    """Set the default-domain opset to `target` (in place) if every node means the same there;
    returns why not (the model is then unchanged)."""
    version = default_opset(model)
    if version is None:
        return "no default-domain opset"
    if target == version:
        return None
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            old, new = onnx.defs.get_schema(node.op_type, target), onnx.defs.get_schema(node.op_type, version)
        except Exception:  # noqa: BLE001 - schema missing at the target opset
            return f"{node.op_type} does not exist at opset {target}"
        if old.since_version != new.since_version and not same_contract(node, old, new):
            return f"{node.op_type} at opset {version} differs from opset {target}"
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = target
    return None


def to_supported_opset(proto: onnx.ModelProto, path: Path) -> tuple[onnx.ModelProto, OpsetConversion | None]:
    """The model in the supported opset range (a copy when it changes), and what was done."""
    version = default_opset(proto)
    newest = onnx.defs.onnx_opset_version()
    if version is None:                # only other domains (ai.onnx.ml, custom): nothing to convert
        return proto, None
    if not ONNXRUNTIME_MIN_OPSET <= version <= newest:
        raise UserError(f"{path}: default-domain opset {version} is not one onnxruntime runs "
                        f"({ONNXRUNTIME_MIN_OPSET}-{newest}); re-export the model at opset {OPSET_MIN}-{OPSET_MAX}")
    target = min(max(version, OPSET_MIN), OPSET_MAX)
    if target == version:
        return proto, None
    if version > OPSET_MAX:                 # newer opsets: most ops only gained types
        relabelled = onnx.ModelProto()
        relabelled.CopyFrom(proto)
        if relabel(relabelled, target) is None:
            return relabelled, OpsetConversion(version, target, "relabelled")
    try:
        converted = onnx.version_converter.convert_version(proto, target)
        onnx.checker.check_model(converted)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError/ValidationError with C++ text
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: opset {version} is outside {OPSET_MIN}-{OPSET_MAX} and onnx.version_converter "
                        f"cannot convert it to opset {target} ({why}); re-export the model at opset "
                        f"{OPSET_MIN}-{OPSET_MAX}") from None
    return converted, OpsetConversion(version, target, "onnx.version_converter")


def check_conversion(original: Path, converted: onnx.ModelProto, inputs: dict[str, np.ndarray], conv: OpsetConversion,
                     rtol: float, atol: float) -> None:
    """Run the original file and the converted model in onnxruntime on the same inputs; a
    difference beyond the spec's tolerances is a UserError. Records the result in `conv.check`."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        ref_sess = ort.InferenceSession(str(original), so, providers=["CPUExecutionProvider"])
        ref = ref_sess.run(None, inputs)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        conv.check = f"not checked: onnxruntime cannot run the original ({str(e).strip().splitlines()[0][:120]})"
        return
    try:
        got = ort.InferenceSession(converted.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, inputs)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{original}: the model converted from opset {conv.source} to {conv.target} does not run in "
                        f"onnxruntime ({str(e).strip().splitlines()[0][:200]}); re-export the model at opset "
                        f"{OPSET_MIN}-{OPSET_MAX}") from None
    worst = 0.0
    for out, a, b in zip(ref_sess.get_outputs(), ref, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or not np.allclose(b, a, rtol=rtol, atol=atol, equal_nan=True):
            raise UserError(f"{original}: converting opset {conv.source} to {conv.target} ({conv.how}) changes output "
                            f"'{out.name}' in onnxruntime beyond rtol {rtol:g} / atol {atol:g}; re-export the model "
                            f"at opset {OPSET_MIN}-{OPSET_MAX}")
        if a.size and a.dtype.kind in "fc":
            worst = max(worst, float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    conv.check = f"checked against the original in onnxruntime: max abs err {worst:.3g}"


def check_onnxruntime_knows(proto: onnx.ModelProto, path: Path) -> None:
    """With partial offload, the nodes the packager cannot compile stay in onnxruntime; a node of an
    operator onnxruntime does not know either (a custom domain) would leave a package whose
    ort/model.onnx cannot load. Refuse it, naming the operators and their nodes."""
    from onnxruntime.capi import _pybind_state as ort_schemas

    known = {(s.domain, s.name) for s in ort_schemas.get_all_operator_schema()}
    known |= {(f.domain, f.name) for f in proto.functions}         # the model's own functions
    unknown: dict[str, list[str]] = {}
    for g in all_graphs(proto.graph):
        for i, n in enumerate(g.node):
            domain = "" if n.domain == "ai.onnx" else n.domain
            if (domain, n.op_type) not in known:
                unknown.setdefault(f"{domain}.{n.op_type}" if domain else n.op_type, []).append(n.name or f"#{i}")
    if unknown:
        ops = "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(unknown.items()))
        raise UserError(f"{path}: neither the packager nor onnxruntime implements {ops}: the package's "
                        "ort/model.onnx could not load; replace these nodes with standard ONNX operators")
