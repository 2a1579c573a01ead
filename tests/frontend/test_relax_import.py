"""The Relax import (frontend/relax_import.py): graph inputs whose names are not C identifiers
('gpu_0/data_0', as ONNX's Caffe2-era models name them) are renamed on the way in, so the kernels'
CUDA and OpenCL sources compile (the CUDA build of the corpus's ShuffleNet failed on it)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from packager.frontend import import_relax, load_model
from support.helpers import save_model


def _model(name: str):
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", [name, "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_inputs_that_are_not_identifiers_are_renamed(tmp_path):
    path = save_model(_model("gpu_0/data_0"), tmp_path / "m.onnx")
    mod, _ = import_relax(load_model(Path(path)), {"gpu_0/data_0": (1, 3, 8, 8)}, {"gpu_0/data_0": "float32"})
    assert [p.name for p in mod["main"].params] == ["gpu_0_data_0"]


def test_the_cuda_source_of_such_a_model_names_valid_parameters(tmp_path):
    from packager.codegen.cuda_source import generate_cuda
    from packager.optimize.schedule.rules.gpu import schedule_kernels_gpu
    from packager.spec import TargetSpec
    from packager.targets import resolve
    from support.kernel_cases import kernels_of

    kernels = kernels_of(_model("gpu_0/data_0"))
    h100 = resolve(TargetSpec("h100", {}, "test"))
    scheduled, _ = schedule_kernels_gpu(kernels, h100)
    source = generate_cuda(scheduled, h100).source
    assert "gpu_0/data_0" not in source and "gpu_0_data_0_ptr" in source
