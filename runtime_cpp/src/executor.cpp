#include "executor.h"

#include "cpu/cpu_executor.h"
#include "cuda/cuda_executor.h"
#include "error.h"

namespace packrt {
namespace {

// Every executor, by the device name that plans (Plan::device) and targets (TargetEntry::kind) use.
struct ExecutorKind {
  const char* device;
  std::unique_ptr<Executor> (*open)(ExecutorSource& source);
};
constexpr ExecutorKind kExecutors[] = {{"cpu", open_cpu_executor}, {"cuda", open_cuda_executor}};

}  // namespace

std::unique_ptr<Executor> open_executor(ExecutorSource source) {
  const TargetEntry& t = source.target;
  const Plan& plan = source.plan;
  if (t.kind != plan.device)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, t.plan + " is a " + plan.device + " plan for a " + t.kind + " target");
  for (const ExecutorKind& kind : kExecutors)
    if (plan.device == kind.device) return kind.open(source);
  fail(PACKRT_ERROR_UNSUPPORTED, "device '" + plan.device + "' is not supported by this runtime");
}

}  // namespace packrt
