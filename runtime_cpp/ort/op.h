// ONNX Runtime custom-op library: domain "ai.packager", op "PackagedModel".
//
// Each node names a package folder (attribute `package`; optional `target`, `num_threads`,
// `package_id`, `package_sha256`) and runs it through the packrt C API on ONNX Runtime's tensors. The package is
// opened once per kernel instance (once per session); concurrent Compute calls are safe because
// packrt gives every concurrent run its own scratch memory.
//
// The op is registered twice under the same name (register.cc): for the CPU EP (host tensors,
// CPU targets, run with packrt_run: cpu/compute.cc) and for the CUDA EP (device tensors, CUDA
// targets, run with packrt_run_device on ONNX Runtime's compute stream: cuda/compute.cc), so a
// session with the CUDA EP keeps the data on the GPU. A package without a CUDA target still runs
// under the CUDA EP: its CPU target is used and the tensors are copied between the GPU and the
// host around the run.
//
// Built with ORT_API_MANUAL_INIT (every file of the library includes ORT's API through this
// header): the library does not link libonnxruntime, so the same binary loads in onnxruntime and
// onnxruntime-gpu. Only RegisterCustomOps is exported (version script).
//
// Relative `package` paths resolve against the wrapper model's folder. ONNX Runtime's C API does
// not tell a kernel where its model file is, so the folder is found as, in order: the session
// config entry "ai.packager.model_dir" (set before registering the library), else the folder
// above this library's own folder (a package ships the library as ort/<arch>/ next to its
// ort/model.onnx). `package_id` guards against resolving into the wrong package; `package_sha256`
// (the sha256 of the package's manifest.json, which lists every file's sha256) pins the exact build.
#pragma once
#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include <packrt/packrt.h>

#include <string>
#include <vector>

namespace packager_ort {

constexpr const char* kDomain = "ai.packager";
constexpr const char* kModelDirKey = "ai.packager.model_dir";
constexpr const char* kThreadsKey = "ai.packager.num_threads";

// Per registration (per session options): where relative package paths point, default threads.
struct Settings {
  std::string model_dir;  // empty: the folder above this library
  int num_threads = 0;
};

struct PackagedModelKernel;

// How a kernel runs its package once the node's tensors are bound: `ins`/`outs` are in the
// package's order and point at ONNX Runtime's tensor memory (host or device, per EP).
using ComputeFn = OrtStatusPtr (*)(const PackagedModelKernel& kernel, Ort::KernelContext& ctx,
                                   std::vector<packrt_tensor>& ins, std::vector<packrt_tensor>& outs);

// cpu/compute.cc: host tensors, packrt_run (the CPU EP).
OrtStatusPtr compute_on_host(const PackagedModelKernel& kernel, Ort::KernelContext& ctx,
                             std::vector<packrt_tensor>& ins, std::vector<packrt_tensor>& outs);
// cuda/compute.cc: device tensors, a CUDA target, packrt_run_device on ONNX Runtime's stream.
OrtStatusPtr compute_on_device(const PackagedModelKernel& kernel, Ort::KernelContext& ctx,
                               std::vector<packrt_tensor>& ins, std::vector<packrt_tensor>& outs);
// cuda/compute.cc: device tensors, a CPU target: copied to the host and back around packrt_run.
OrtStatusPtr compute_staged(const PackagedModelKernel& kernel, Ort::KernelContext& ctx,
                            std::vector<packrt_tensor>& ins, std::vector<packrt_tensor>& outs);

struct PackagedModelKernel {
  packrt_model* model = nullptr;
  ComputeFn compute = compute_on_host;  // chosen when the package is opened
  std::string node;
  std::vector<std::string> input_names, output_names;

  PackagedModelKernel() = default;
  PackagedModelKernel(const PackagedModelKernel&) = delete;
  PackagedModelKernel& operator=(const PackagedModelKernel&) = delete;
  ~PackagedModelKernel() { packrt_close(model); }

  OrtStatusPtr error(OrtErrorCode code, const std::string& msg) const {
    return Ort::GetApi().CreateStatus(code, ("PackagedModel node '" + node + "': " + msg).c_str());
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) noexcept;  // binds the tensors, then `compute`
};

struct PackagedModelOp : Ort::CustomOpBase<PackagedModelOp, PackagedModelKernel, /*WithStatus=*/true> {
  PackagedModelOp(Settings s, bool on_cuda) : settings(std::move(s)), cuda(on_cuda) {}

  // Opens the node's package (a CUDA target under the CUDA EP, else a CPU one) and checks it.
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* raw, void** kernel) const noexcept;

  const char* GetName() const { return "PackagedModel"; }
  const char* GetExecutionProviderType() const { return cuda ? "CUDAExecutionProvider" : nullptr; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicInputMinArity() const { return 0; }
  bool GetVariadicInputHomogeneity() const { return false; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicOutputMinArity() const { return 1; }
  bool GetVariadicOutputHomogeneity() const { return false; }

  Settings settings;
  bool cuda = false;
};

}  // namespace packager_ort
