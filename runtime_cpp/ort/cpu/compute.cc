// The PackagedModel op under the CPU EP: host tensors, run in place with packrt_run.
#include "../op.h"

namespace packager_ort {

OrtStatusPtr compute_on_host(const PackagedModelKernel& kernel, Ort::KernelContext&, std::vector<packrt_tensor>& ins,
                             std::vector<packrt_tensor>& outs) {
  if (packrt_run(kernel.model, ins.data(), static_cast<int32_t>(ins.size()), outs.data(),
                 static_cast<int32_t>(outs.size())) != PACKRT_OK)
    return kernel.error(ORT_FAIL, packrt_last_error());
  return nullptr;
}

}  // namespace packager_ort
