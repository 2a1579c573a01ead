// The PackagedModel op under the CUDA EP: device tensors, on ONNX Runtime's compute stream.
#include "../op.h"

#include <cstdint>

#include "cuda/cuda_driver.h"

namespace packager_ort {

OrtStatusPtr compute_on_device(const PackagedModelKernel& kernel, Ort::KernelContext& ctx,
                               std::vector<packrt_tensor>& ins, std::vector<packrt_tensor>& outs) {
  if (packrt_run_device(kernel.model, ins.data(), static_cast<int32_t>(ins.size()), outs.data(),
                        static_cast<int32_t>(outs.size()), ctx.GetGPUComputeStream()) != PACKRT_OK)
    return kernel.error(ORT_FAIL, packrt_last_error());
  return nullptr;
}

OrtStatusPtr compute_staged(const PackagedModelKernel& kernel, Ort::KernelContext& ctx,
                            std::vector<packrt_tensor>& ins, std::vector<packrt_tensor>& outs) {
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
  if (OrtStatusPtr failed = compute_on_host(kernel, ctx, ins, outs)) return failed;
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].nbytes)
      packrt::cuda_check(cu.cuMemcpyHtoDAsync(reinterpret_cast<packrt::CUdeviceptr>(device_out[k]), host_out[k].data(),
                                              outs[k].nbytes, stream), "copying an output to the GPU");
  packrt::cuda_check(cu.cuStreamSynchronize(stream), "copying outputs to the GPU");
  return nullptr;
}

}  // namespace packager_ort
