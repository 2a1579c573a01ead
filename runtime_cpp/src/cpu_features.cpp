#include "cpu_features.h"

#include <thread>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace packrt {

const char* host_arch() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "unknown";
#endif
}

int host_cores() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = static_cast<long>(std::thread::hardware_concurrency());
  return n < 1 ? 1 : static_cast<int>(n);
}

#if defined(__x86_64__)
// Linux gives a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA); without it the first tile instruction raises SIGILL. Asked once, for every thread.
static bool amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}
#endif

static bool has_feature(const std::string& f) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the AVX/AVX-512 register state.
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "bmi2") return __builtin_cpu_supports("bmi2");
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (f == "avx512cd") return __builtin_cpu_supports("avx512cd");
  if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
  if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (f == "avx512_vnni") return __builtin_cpu_supports("avx512vnni");
  if (f == "avx_vnni") return __builtin_cpu_supports("avxvnni");
  if (f == "avx512_bf16") return __builtin_cpu_supports("avx512bf16");
  if (f == "amx_tile") return __builtin_cpu_supports("amx-tile") && amx_granted();
  if (f == "amx_int8") return __builtin_cpu_supports("amx-int8");
  if (f == "amx_bf16") return __builtin_cpu_supports("amx-bf16");
  if (f == "f16c") {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && __builtin_cpu_supports("avx");
  }
  return false;
#elif defined(__aarch64__)
  unsigned long hw = getauxval(AT_HWCAP);
  if (f == "asimd") return hw & HWCAP_ASIMD;
  if (f == "fp") return hw & HWCAP_FP;
  if (f == "asimddp") return hw & HWCAP_ASIMDDP;
  if (f == "fphp") return hw & HWCAP_FPHP;
  if (f == "asimdhp") return hw & HWCAP_ASIMDHP;
  if (f == "sve") return hw & HWCAP_SVE;
  return false;
#else
  (void)f;
  return false;
#endif
}

std::vector<std::string> missing_cpu_features(const std::vector<std::string>& required) {
  std::vector<std::string> missing;
  for (const auto& f : required)
    if (!has_feature(f)) missing.push_back(f);
  return missing;
}

}  // namespace packrt
