// ONNX Runtime custom-op library: domain "ai.packager", op "PackagedModel".
//
// Each node names a package folder (attribute `package`; optional `target`, `num_threads`,
// `package_id`) and runs it through the packrt C API on ONNX Runtime's tensors. The package is
// opened once per kernel instance (once per session); concurrent Compute calls are safe because
// packrt gives every concurrent run its own scratch memory.
//
// The op is registered twice under the same name: for the CPU EP (host tensors, CPU targets, run
// with packrt_run) and for the CUDA EP (device tensors, CUDA targets, run with packrt_run_device
// on ONNX Runtime's compute stream), so a session with the CUDA EP keeps the data on the GPU. A
// package without a CUDA target still runs under the CUDA EP: its CPU target is used and the
// tensors are copied between the GPU and the host around the run.
//
// Built with ORT_API_MANUAL_INIT: the library does not link libonnxruntime, so the same binary
// loads in onnxruntime and onnxruntime-gpu. Only RegisterCustomOps is exported (version script).
//
// Relative `package` paths resolve against the wrapper model's folder. ONNX Runtime's C API does
// not tell a kernel where its model file is, so the folder is found as, in order: the session
// config entry "ai.packager.model_dir" (set before registering the library), else the folder
// above this library's own folder (a package ships the library as ort/<arch>/ next to its
// ort/model.onnx). `package_id` guards against resolving into the wrong package.
#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include <packrt/packrt.h>

#include "cuda_driver.h"

#include <dlfcn.h>
#include <libgen.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define PACKAGER_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr const char* kDomain = "ai.packager";
constexpr const char* kModelDirKey = "ai.packager.model_dir";
constexpr const char* kThreadsKey = "ai.packager.num_threads";

struct DtypeMap {
  ONNXTensorElementDataType onnx;
  int32_t packrt;
};
constexpr DtypeMap kDtypes[] = {
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, PACKRT_FLOAT32}, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, PACKRT_FLOAT16},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, PACKRT_FLOAT64}, {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, PACKRT_INT8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, PACKRT_INT16},    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, PACKRT_INT32},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, PACKRT_INT64},    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, PACKRT_UINT8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, PACKRT_BOOL}};

int32_t to_packrt(ONNXTensorElementDataType t) {
  for (const auto& d : kDtypes)
    if (d.onnx == t) return d.packrt;
  return PACKRT_DTYPE_UNKNOWN;
}

std::string library_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&library_dir), &info) || !info.dli_fname) return ".";
  char buf[PATH_MAX];
  if (!realpath(info.dli_fname, buf)) return ".";
  return dirname(buf);
}

// Per registration (per session options): where relative package paths point, default threads.
struct Settings {
  std::string model_dir;  // empty: the folder above this library
  int num_threads = 0;
};

struct PackagedModelKernel {
  packrt_model* model = nullptr;
  bool cuda = false;    // registered for the CUDA EP: tensors live on the GPU
  bool staged = false;  // CUDA EP, but a CPU target: copy tensors through host memory
  std::string node;
  std::vector<std::string> input_names, output_names;

  ~PackagedModelKernel() { packrt_close(model); }

  OrtStatusPtr error(OrtErrorCode code, const std::string& msg) const {
    return Ort::GetApi().CreateStatus(code, ("PackagedModel node '" + node + "': " + msg).c_str());
  }

  OrtStatusPtr run_staged(Ort::KernelContext& ctx, std::vector<packrt_tensor>& ins,
                          std::vector<packrt_tensor>& outs) const;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) noexcept {
    try {
      Ort::KernelContext ctx(raw);
      if (ctx.GetInputCount() != input_names.size())
        return error(ORT_INVALID_ARGUMENT, "got " + std::to_string(ctx.GetInputCount()) + " inputs, the package takes " +
                                               std::to_string(input_names.size()));
      std::vector<packrt_tensor> ins(input_names.size());
      std::vector<Ort::ConstValue> keep;
      for (size_t i = 0; i < ins.size(); ++i) {
        Ort::ConstValue v = ctx.GetInput(i);
        auto info = v.GetTensorTypeAndShapeInfo();
        auto shape = info.GetShape();
        packrt_tensor& t = ins[i];
        std::memset(&t, 0, sizeof t);
        t.name = input_names[i].c_str();
        t.dtype = to_packrt(info.GetElementType());
        if (shape.size() > PACKRT_MAX_DIMS) return error(ORT_INVALID_ARGUMENT, "input '" + input_names[i] + "' has too many dims");
        t.ndim = static_cast<int32_t>(shape.size());
        std::copy(shape.begin(), shape.end(), t.shape);
        t.data = const_cast<void*>(v.GetTensorRawData());
        t.nbytes = info.GetElementCount() * packrt_dtype_size(t.dtype);
        keep.push_back(v);
      }
      int32_t profile = 0;
      if (packrt_select_profile(model, ins.data(), static_cast<int32_t>(ins.size()), &profile) != PACKRT_OK)
        return error(ORT_INVALID_ARGUMENT, packrt_last_error());
      std::vector<packrt_tensor> outs(output_names.size());
      for (size_t k = 0; k < outs.size(); ++k) {
        packrt_tensor info;
        if (packrt_output_info(model, profile, static_cast<int32_t>(k), &info) != PACKRT_OK)
          return error(ORT_FAIL, packrt_last_error());
        std::vector<int64_t> shape(info.shape, info.shape + info.ndim);
        Ort::UnownedValue out = ctx.GetOutput(k, shape);
        outs[k] = info;
        outs[k].name = output_names[k].c_str();
        outs[k].data = out.GetTensorMutableRawData();
      }
      if (staged) return run_staged(ctx, ins, outs);
      packrt_status st = cuda ? packrt_run_device(model, ins.data(), static_cast<int32_t>(ins.size()), outs.data(),
                                                  static_cast<int32_t>(outs.size()), ctx.GetGPUComputeStream())
                              : packrt_run(model, ins.data(), static_cast<int32_t>(ins.size()), outs.data(),
                                           static_cast<int32_t>(outs.size()));
      if (st != PACKRT_OK) return error(ORT_FAIL, packrt_last_error());
      return nullptr;
    } catch (const std::exception& e) {
      return error(ORT_FAIL, e.what());
    }
  }
};

inline OrtStatusPtr PackagedModelKernel::run_staged(Ort::KernelContext& ctx, std::vector<packrt_tensor>& ins,
                                                  std::vector<packrt_tensor>& outs) const {
  const packrt::CudaDriver& cu = packrt::cuda_driver();
  auto stream = static_cast<packrt::CUstream>(ctx.GetGPUComputeStream());
  std::vector<std::vector<uint8_t>> host_in(ins.size()), host_out(outs.size());
  for (size_t i = 0; i < ins.size(); ++i) {
    host_in[i].resize(ins[i].nbytes);
    if (ins[i].nbytes)
      packrt::cuda_check(cu.cuMemcpyDtoHAsync(host_in[i].data(), reinterpret_cast<packrt::CUdeviceptr>(ins[i].data),
                                              ins[i].nbytes, stream), "copying an input to the host");
    ins[i].data = host_in[i].data();
  }
  packrt::cuda_check(cu.cuStreamSynchronize(stream), "waiting for ONNX Runtime's stream");
  std::vector<void*> device_out(outs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    device_out[k] = outs[k].data;
    host_out[k].resize(outs[k].nbytes);
    outs[k].data = host_out[k].data();
  }
  if (packrt_run(model, ins.data(), static_cast<int32_t>(ins.size()), outs.data(), static_cast<int32_t>(outs.size())) !=
      PACKRT_OK)
    return error(ORT_FAIL, packrt_last_error());
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].nbytes)
      packrt::cuda_check(cu.cuMemcpyHtoDAsync(reinterpret_cast<packrt::CUdeviceptr>(device_out[k]), host_out[k].data(),
                                              outs[k].nbytes, stream), "copying an output to the GPU");
  packrt::cuda_check(cu.cuStreamSynchronize(stream), "copying outputs to the GPU");
  return nullptr;
}

struct PackagedModelOp : Ort::CustomOpBase<PackagedModelOp, PackagedModelKernel, /*WithStatus=*/true> {
  PackagedModelOp(Settings s, bool on_cuda) : settings(std::move(s)), cuda(on_cuda) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* raw, void** kernel) const noexcept {
    try {
      Ort::ConstKernelInfo info(raw);
      auto node = info.GetNodeName();
      auto fail = [&](const std::string& msg) {
        return api.CreateStatus(ORT_INVALID_ARGUMENT, ("PackagedModel node '" + node + "': " + msg).c_str());
      };
      std::string package = string_attr(info, "package");
      if (package.empty()) return fail("attribute 'package' (the package folder) is missing");
      std::string base = settings.model_dir.empty() ? library_dir() + "/.." : settings.model_dir;
      std::string path = package[0] == '/' ? package : base + "/" + package;
      std::string target = string_attr(info, "target");
      int threads = static_cast<int>(int_attr(info, "num_threads", settings.num_threads));

      packrt_options opt;
      packrt_options_init(&opt);
      opt.target = target.empty() ? nullptr : target.c_str();
      opt.num_threads = threads;
      opt.device_type = cuda ? 2 : 1;  // the CUDA EP gets device tensors, the CPU EP host tensors
      auto k = std::make_unique<PackagedModelKernel>();
      k->node = node;
      k->cuda = cuda;
      packrt_status opened = packrt_open(path.c_str(), &opt, &k->model);
      if (opened != PACKRT_OK && cuda && target.empty()) {  // no usable CUDA target: a CPU one, staged
        std::string cuda_error = packrt_last_error();
        opt.device_type = 1;
        opened = packrt_open(path.c_str(), &opt, &k->model);
        k->staged = opened == PACKRT_OK;
        if (!k->staged) return fail("no CUDA target runs here (" + cuda_error + ") and no CPU target either (" +
                                    packrt_last_error() + ")");
      }
      if (opened == PACKRT_OK && cuda && !k->staged && std::string(packrt_model_device(k->model)) != "cuda")
        k->staged = true;  // the node names a CPU target but runs under the CUDA EP
      if (opened != PACKRT_OK) {
        std::string hint = package[0] == '/' ? "" : " (relative to " + base +
            "; set the session config entry '" + kModelDirKey + "' to the wrapper model's folder if the library "
            "is not the one shipped next to it)";
        return fail(std::string(packrt_last_error()) + hint);
      }
      std::string want_id = string_attr(info, "package_id");
      if (!want_id.empty() && want_id != packrt_model_id(k->model))
        return fail("'" + path + "' holds package '" + packrt_model_name(k->model) + "' (id " +
                    packrt_model_id(k->model) + "), not the one this model was built with (id " + want_id +
                    "); use the custom-op library shipped in this model's package or set '" + kModelDirKey + "'");
      for (int32_t i = 0; i < packrt_num_inputs(k->model); ++i) {
        packrt_tensor t;
        packrt_input_info(k->model, 0, i, &t);
        k->input_names.emplace_back(t.name);
      }
      for (int32_t i = 0; i < packrt_num_outputs(k->model); ++i) {
        packrt_tensor t;
        packrt_output_info(k->model, 0, i, &t);
        k->output_names.emplace_back(t.name);
      }
      if (info.GetInputCount() != k->input_names.size() || info.GetOutputCount() != k->output_names.size())
        return fail("the node has " + std::to_string(info.GetInputCount()) + " inputs / " +
                    std::to_string(info.GetOutputCount()) + " outputs, the package has " +
                    std::to_string(k->input_names.size()) + " / " + std::to_string(k->output_names.size()));
      *kernel = k.release();
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_FAIL, (std::string("PackagedModel: ") + e.what()).c_str());
    }
  }

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

  static std::string string_attr(const Ort::ConstKernelInfo& info, const char* name) {
    try {
      return info.GetAttribute<std::string>(name);
    } catch (const Ort::Exception&) {
      return "";
    }
  }
  static int64_t int_attr(const Ort::ConstKernelInfo& info, const char* name, int64_t fallback) {
    try {
      return info.GetAttribute<int64_t>(name);
    } catch (const Ort::Exception&) {
      return fallback;
    }
  }

  Settings settings;
  bool cuda = false;
};

// Ops and domains must outlive every session that uses them: keep them for the process lifetime.
std::mutex g_mu;
std::vector<std::unique_ptr<PackagedModelOp>> g_ops;
std::vector<Ort::CustomOpDomain> g_domains;

std::string config_entry(const OrtApi* api, const OrtSessionOptions* options, const char* key) {
  int has = 0;
  if (OrtStatus* st = api->HasSessionConfigEntry(options, key, &has)) {
    api->ReleaseStatus(st);
    return "";
  }
  if (!has) return "";
  size_t size = 0;
  if (OrtStatus* st = api->GetSessionConfigEntry(options, key, nullptr, &size)) api->ReleaseStatus(st);
  std::string value(size, '\0');
  if (OrtStatus* st = api->GetSessionConfigEntry(options, key, &value[0], &size)) {
    api->ReleaseStatus(st);
    return "";
  }
  value.resize(size ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

}  // namespace

PACKAGER_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (!api) {  // onnxruntime older than the headers we were built with: report through API v1
    std::string msg = std::string("packager custom ops need ONNX Runtime API ") + std::to_string(ORT_API_VERSION) +
                      " (onnxruntime 1." + std::to_string(ORT_API_VERSION) + "+); this is " + api_base->GetVersionString();
    return api_base->GetApi(1)->CreateStatus(ORT_FAIL, msg.c_str());
  }
  Ort::InitApi(api);
  try {
    Settings s;
    s.model_dir = config_entry(api, options, kModelDirKey);
    std::string threads = config_entry(api, options, kThreadsKey);
    if (!threads.empty()) s.num_threads = std::atoi(threads.c_str());
    std::lock_guard<std::mutex> lock(g_mu);
    Ort::CustomOpDomain domain{kDomain};
    for (bool on_cuda : {false, true}) {
      g_ops.push_back(std::make_unique<PackagedModelOp>(s, on_cuda));
      domain.Add(g_ops.back().get());
    }
    Ort::UnownedSessionOptions(options).Add(domain);
    g_domains.push_back(std::move(domain));
    return nullptr;
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
}
