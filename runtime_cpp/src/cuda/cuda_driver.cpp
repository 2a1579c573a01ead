#include "cuda/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

#include "error.h"

namespace packrt {
namespace {

constexpr int kAttrComputeMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

struct Loaded {
  CudaDriver api{};
  std::string error;  // empty: usable
};

template <typename F>
bool load(void* lib, F& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

const Loaded& loaded() {
  static Loaded l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      l.error = std::string("no CUDA driver: libcuda.so.1 could not be loaded (") + (e ? e : "not found") +
                "); CUDA targets need an NVIDIA GPU and its driver";
      return;
    }
    std::string missing;
    CudaDriver& a = l.api;
    load(lib, a.cuInit, "cuInit", missing);
    load(lib, a.cuDriverGetVersion, "cuDriverGetVersion", missing);
    load(lib, a.cuDeviceGetCount, "cuDeviceGetCount", missing);
    load(lib, a.cuDeviceGet, "cuDeviceGet", missing);
    load(lib, a.cuDeviceGetAttribute, "cuDeviceGetAttribute", missing);
    load(lib, a.cuDeviceGetName, "cuDeviceGetName", missing);
    load(lib, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", missing);
    load(lib, a.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", missing);
    load(lib, a.cuCtxPushCurrent, "cuCtxPushCurrent_v2", missing);
    load(lib, a.cuCtxPopCurrent, "cuCtxPopCurrent_v2", missing);
    load(lib, a.cuModuleLoadData, "cuModuleLoadData", missing);
    load(lib, a.cuModuleUnload, "cuModuleUnload", missing);
    load(lib, a.cuModuleGetFunction, "cuModuleGetFunction", missing);
    load(lib, a.cuFuncSetAttribute, "cuFuncSetAttribute", missing);
    load(lib, a.cuMemAlloc, "cuMemAlloc_v2", missing);
    load(lib, a.cuMemFree, "cuMemFree_v2", missing);
    load(lib, a.cuMemcpyHtoD, "cuMemcpyHtoD_v2", missing);
    load(lib, a.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", missing);
    load(lib, a.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", missing);
    load(lib, a.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", missing);
    load(lib, a.cuStreamCreate, "cuStreamCreate", missing);
    load(lib, a.cuStreamDestroy, "cuStreamDestroy_v2", missing);
    load(lib, a.cuStreamSynchronize, "cuStreamSynchronize", missing);
    load(lib, a.cuLaunchKernel, "cuLaunchKernel", missing);
    load(lib, a.cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", missing);
    load(lib, a.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", missing);
    load(lib, a.cuStreamBeginCapture, "cuStreamBeginCapture_v2", missing);
    load(lib, a.cuStreamEndCapture, "cuStreamEndCapture", missing);
    load(lib, a.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", missing);
    load(lib, a.cuGraphLaunch, "cuGraphLaunch", missing);
    load(lib, a.cuGraphExecDestroy, "cuGraphExecDestroy", missing);
    load(lib, a.cuGraphDestroy, "cuGraphDestroy", missing);
    load(lib, a.cuGetErrorString, "cuGetErrorString", missing);
    if (!missing.empty()) {
      l.error = "the CUDA driver is too old (libcuda.so.1 lacks " + missing + "); install driver 525 or newer";
      return;
    }
    CUresult r = a.cuInit(0);
    if (r != 0) {
      const char* msg = nullptr;
      a.cuGetErrorString(r, &msg);
      l.error = std::string("no usable CUDA device: cuInit failed (") + (msg ? msg : "error " + std::to_string(r)) + ")";
    }
  });
  return l;
}

}  // namespace

const CudaDriver& cuda_driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) fail(PACKRT_ERROR_UNSUPPORTED, l.error);
  return l.api;
}

void cuda_check(CUresult r, const char* what) {
  if (r == 0) return;
  const char* msg = nullptr;
  if (loaded().api.cuGetErrorString) loaded().api.cuGetErrorString(r, &msg);
  fail(PACKRT_ERROR_RUNTIME, std::string(what) + " failed: " + (msg ? msg : "CUDA error " + std::to_string(r)));
}

int cuda_device_sm(int ordinal, std::string* why) {
  const Loaded& l = loaded();
  if (!l.error.empty()) {
    if (why) *why = l.error;
    return -1;
  }
  int count = 0;
  if (l.api.cuDeviceGetCount(&count) != 0 || ordinal < 0 || ordinal >= count) {
    if (why) *why = "no CUDA device " + std::to_string(ordinal) + " (this machine has " + std::to_string(count) + ")";
    return -1;
  }
  CUdevice dev = 0;
  int major = 0, minor = 0;
  cuda_check(l.api.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  cuda_check(l.api.cuDeviceGetAttribute(&major, kAttrComputeMajor, dev), "cuDeviceGetAttribute");
  cuda_check(l.api.cuDeviceGetAttribute(&minor, kAttrComputeMinor, dev), "cuDeviceGetAttribute");
  return major * 10 + minor;
}

}  // namespace packrt
