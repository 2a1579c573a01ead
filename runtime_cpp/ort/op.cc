// The PackagedModel op: opening a node's package (CreateKernelV2) and binding ONNX Runtime's
// tensors to its inputs and outputs (ComputeV2); the run itself is the kernel's ComputeFn.
#include "op.h"

#include <dlfcn.h>
#include <libgen.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace packager_ort {
namespace {

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

std::string string_attr(const Ort::ConstKernelInfo& info, const char* name) {
  try {
    return info.GetAttribute<std::string>(name);
  } catch (const Ort::Exception&) {
    return "";
  }
}

int64_t int_attr(const Ort::ConstKernelInfo& info, const char* name, int64_t fallback) {
  try {
    return info.GetAttribute<int64_t>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

// The package's input and output names (the same in every profile).
void read_io_names(PackagedModelKernel& k) {
  for (int32_t i = 0; i < packrt_num_inputs(k.model); ++i) {
    packrt_tensor t;
    packrt_input_info(k.model, 0, i, &t);
    k.input_names.emplace_back(t.name);
  }
  for (int32_t i = 0; i < packrt_num_outputs(k.model); ++i) {
    packrt_tensor t;
    packrt_output_info(k.model, 0, i, &t);
    k.output_names.emplace_back(t.name);
  }
}

}  // namespace

OrtStatusPtr PackagedModelOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* raw,
                                             void** kernel) const noexcept {
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
    std::string pin = string_attr(info, "package_sha256");   // written by pack build: only that build opens
    int64_t threads64 = int_attr(info, "num_threads", settings.num_threads);
    if (threads64 < 0 || threads64 > PACKRT_MAX_THREADS)
      return fail("attribute num_threads must be 0 (one per core) to " + std::to_string(PACKRT_MAX_THREADS));
    int threads = static_cast<int>(threads64);

    // Open: the CUDA EP gets device tensors (a CUDA target), the CPU EP host tensors (a CPU one).
    packrt_options opt;
    packrt_options_init(&opt);
    opt.target = target.empty() ? nullptr : target.c_str();
    opt.num_threads = threads;
    opt.device_type = cuda ? PACKRT_DEVICE_CUDA : PACKRT_DEVICE_CPU;
    opt.expected_sha256 = pin.empty() ? nullptr : pin.c_str();
    auto k = std::make_unique<PackagedModelKernel>();
    k->node = node;
    k->compute = cuda ? compute_on_device : compute_on_host;
    packrt_status opened = packrt_open(path.c_str(), &opt, &k->model);
    if (opened != PACKRT_OK && cuda && target.empty()) {  // no usable CUDA target: a CPU one, staged
      std::string cuda_error = packrt_last_error();
      opt.device_type = PACKRT_DEVICE_CPU;
      opened = packrt_open(path.c_str(), &opt, &k->model);
      if (opened != PACKRT_OK)
        return fail("no CUDA target runs here (" + cuda_error + ") and no CPU target either (" + packrt_last_error() +
                    ")");
      k->compute = compute_staged;
    }
    if (opened == PACKRT_OK && cuda && std::string(packrt_model_device(k->model)) != "cuda")
      k->compute = compute_staged;  // the node names a CPU target but runs under the CUDA EP
    if (opened != PACKRT_OK) {
      // a missing package, or another build than the pinned one: maybe the library resolved '..' elsewhere
      bool located = opened != PACKRT_ERROR_NOT_FOUND && !(opened == PACKRT_ERROR_CORRUPT_PACKAGE && !pin.empty());
      std::string hint = package[0] == '/' || located ? "" : " (relative to " + base +
          "; set the session config entry '" + kModelDirKey + "' to the wrapper model's folder if the library "
          "is not the one shipped next to it)";
      return fail(std::string(packrt_last_error()) + hint);
    }

    // Check it is the package this model was built with, and that the node matches it.
    std::string want_id = string_attr(info, "package_id");
    if (!want_id.empty() && want_id != packrt_model_id(k->model))
      return fail("'" + path + "' holds package '" + packrt_model_name(k->model) + "' (id " +
                  packrt_model_id(k->model) + "), not the one this model was built with (id " + want_id +
                  "); use the custom-op library shipped in this model's package or set '" + kModelDirKey + "'");
    read_io_names(*k);
    if (info.GetInputCount() != k->input_names.size() || info.GetOutputCount() != k->output_names.size())
      return fail("the node has " + std::to_string(info.GetInputCount()) + " inputs / " +
                  std::to_string(info.GetOutputCount()) + " outputs, the package has " +
                  std::to_string(k->input_names.size()) + " / " + std::to_string(k->output_names.size()));
    for (size_t o = 0; o < k->output_names.size(); ++o) {   // the wrapper's declared output types
      packrt_tensor produced;
      if (packrt_output_info(k->model, 0, static_cast<int32_t>(o), &produced) != PACKRT_OK) return fail(packrt_last_error());
      Ort::TypeInfo declared = info.GetOutputTypeInfo(o);
      if (declared.GetONNXType() != ONNX_TYPE_TENSOR) return fail("output '" + k->output_names[o] + "' is not a tensor");
      auto element = declared.GetTensorTypeAndShapeInfo().GetElementType();
      if (element != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED && to_packrt(element) != produced.dtype)
        return fail("output '" + k->output_names[o] + "' is declared with another element type in the model than "
                    "the package's " + packrt_dtype_name(produced.dtype));
    }
    *kernel = k.release();
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, (std::string("PackagedModel: ") + e.what()).c_str());
  }
}

OrtStatusPtr PackagedModelKernel::ComputeV2(OrtKernelContext* raw) noexcept {
  try {
    Ort::KernelContext ctx(raw);
    // Inputs: ONNX Runtime's tensors as they are (dtype, shape, memory).
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
    // Outputs: allocated by ONNX Runtime in the shapes of the profile the inputs select.
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
      // ONNX Runtime allocated this tensor from the wrapper model's declared type: write into it only
      // if it is the type and byte size the package produces (else its buffer would overflow)
      auto got = out.GetTensorTypeAndShapeInfo();
      if (to_packrt(got.GetElementType()) != info.dtype ||
          got.GetElementCount() * packrt_dtype_size(info.dtype) != info.nbytes)
        return error(ORT_INVALID_GRAPH, "output '" + output_names[k] + "' is declared as a different type or size in "
                                        "the model than the package produces (" + packrt_dtype_name(info.dtype) +
                                        ", " + std::to_string(info.nbytes) + " bytes)");
      outs[k] = info;
      outs[k].name = output_names[k].c_str();
      outs[k].data = out.GetTensorMutableRawData();
    }
    return compute(*this, ctx, ins, outs);
  } catch (const std::exception& e) {
    return error(ORT_FAIL, e.what());
  }
}

}  // namespace packager_ort
