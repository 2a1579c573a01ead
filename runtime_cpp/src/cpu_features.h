// What this machine is: architecture name and CPU feature checks, using the feature names the
// packager writes into manifest.json (Linux /proc/cpuinfo spelling).
#pragma once
#include <string>
#include <vector>

namespace packrt {

// "x86_64" or "aarch64" (the architecture this runtime binary was compiled for).
const char* host_arch();

// Number of online CPUs (at least 1).
int host_cores();

// Returns the features of `required` this CPU lacks (unknown names count as missing).
std::vector<std::string> missing_cpu_features(const std::vector<std::string>& required);

}  // namespace packrt
