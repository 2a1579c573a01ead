"""onnxruntime as the reference: a quiet session (CPU or CUDA EP, our custom-op library when
given), and the source model's outputs and intermediate tensors on given inputs, as the build
stores them (reference.json) and verify compares with them."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx

from ..errors import InternalError, UserError
from ..targets import local_cuda_sm


def _within_ir_version(model: str | bytes, error: str) -> bytes | None:
    """The model restamped with the newest IR version this onnxruntime reads, when that is why it
    refused the model (onnx 1.23 stamps IR 14 on every model it makes; ORT 1.31 reads up to 13,
    and the IR number alone does not change what a graph of these operators computes); else
    None. The packaged wrapper model is stamped the same way (emit/ort_wrapper.py)."""
    found = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", error)
    if not found or int(found.group(1)) <= int(found.group(2)):
        return None
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)
    proto.ir_version = int(found.group(2))
    return proto.SerializeToString()


def ort_session(model: str | bytes, threads: int = 0, library: Path | None = None, cuda: bool = False,
                exact: bool = False):
    """An onnxruntime session (quiet logs) on the CPU EP, or with `cuda` on the CUDA EP (an error
    if onnxruntime cannot use it: it would fall back to the CPU silently); `library`: our
    custom-op library, registered with the same thread count for the packaged parts. `exact`:
    only onnxruntime's basic graph optimizations, which keep the model's arithmetic; its default
    level also fuses QuantizeLinear/DequantizeLinear pairs into int8 kernels that round
    differently, so a reference for checking values must not use it."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if exact:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if library is not None:
        if threads:
            so.add_session_config_entry("ai.packager.num_threads", str(threads))
        so.register_custom_ops_library(str(library))
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda else ["CPUExecutionProvider"]
    try:
        sess = ort.InferenceSession(model, so, providers=providers)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own Fail/InvalidGraph kinds
        older = _within_ir_version(model, str(e))
        if older is None:
            raise
        sess = ort.InferenceSession(older, so, providers=providers)
    if not cuda:
        return sess
    if "CUDAExecutionProvider" not in sess.get_providers():
        raise UserError("onnxruntime cannot use its CUDA execution provider here (install onnxruntime-gpu with a "
                        "matching CUDA runtime)")
    return sess


def cuda_ep_available() -> bool:
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers() and local_cuda_sm()[0] is not None


def run_all(sess, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def reference_outputs(model_path: Path, inputs: dict[str, np.ndarray], extra: list[str] = (),
                      cuda: bool = False, proto: onnx.ModelProto | None = None) -> dict[str, np.ndarray]:
    """onnxruntime (CPU EP, or CUDA EP) on the source model (or `proto`, a transformed copy of
    it), basic optimizations only; `extra` intermediate tensors are returned too."""
    try:
        model: str | bytes = str(model_path) if proto is None else proto.SerializeToString()
        if extra:
            if proto is None:
                proto = onnx.load(str(model_path))
            else:                                  # the caller's copy stays as it was
                proto, given = onnx.ModelProto(), proto
                proto.CopyFrom(given)
            have = {o.name for o in proto.graph.output}
            proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in extra if n not in have)
            model = proto.SerializeToString()
        return run_all(ort_session(model, cuda=cuda, exact=True), inputs)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise InternalError(f"onnxruntime, the reference, cannot run {model_path}: {str(e).strip()[:500]}") from None


def model_reference(model_path: Path, inputs: dict[str, np.ndarray], boundary: list[str],
                    inlined: onnx.ModelProto | None, cuda: bool = False) -> dict[str, np.ndarray]:
    """The source model's outputs and `boundary` tensors. Tensors of an If branch or Loop body the
    build inlined exist only in the inlined model: they come from onnxruntime running that one."""
    if inlined is None:
        return reference_outputs(model_path, inputs, boundary, cuda=cuda)
    refs = reference_outputs(model_path, inputs, cuda=cuda)
    flat = reference_outputs(model_path, inputs, boundary, cuda=cuda, proto=inlined)
    return {**flat, **refs}
