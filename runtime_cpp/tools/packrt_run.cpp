// packrt-run: run a package from .npy inputs, write .npy outputs, print latency statistics.
//   packrt-run PKG [--target NAME] --input NAME=FILE.npy ... [--output-dir DIR]
//              [--warmup N] [--iters N] [--threads N] [--json FILE] [--info]
// Exit codes: 0 ok, 2 bad input (arguments, files, shapes, package), 1 runtime failure.
#include <packrt/npy.hpp>
#include <packrt/packrt.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

std::string file_safe(std::string name) {
  for (char& c : name)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  return name.empty() ? "output" : name;
}

// This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: that survives exec and
// would include the memory of the process that forked us (e.g. a Python benchmark driver).
double peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

void print_info(const packrt::Model& m) {
  std::printf("package: %s  target: %s  threads: %d\n", m.name().c_str(), m.target().c_str(), m.num_threads());
  for (int p = 0; p < m.num_profiles(); ++p) {
    std::printf("profile %s\n", m.profile_name(p).c_str());
    for (auto& t : m.inputs(p))
      std::printf("  input  %s: %s %s\n", t.name.c_str(), packrt_dtype_name(t.dtype), shape_str(t.shape).c_str());
    for (auto& t : m.outputs(p))
      std::printf("  output %s: %s %s\n", t.name.c_str(), packrt_dtype_name(t.dtype), shape_str(t.shape).c_str());
  }
}

int run(int argc, char** argv) {
  CLI::App app{"Run a packaged model from .npy inputs (packager runtime " + std::string(packrt_version()) + ")"};
  std::string package, target, output_dir, json_path;
  std::vector<std::string> inputs;
  int warmup = 1, iters = 10, threads = 0, cuda_device = 0;
  bool cuda_graph = false;
  bool info = false, no_verify = false, profile = false;
  app.add_option("package", package, "package folder")->required();
  app.add_option("--target", target, "target to run (default: the first that runs on this machine)");
  app.add_option("--cuda-device", cuda_device, "CUDA device ordinal for CUDA targets")->check(CLI::NonNegativeNumber);
  app.add_flag("--cuda-graph", cuda_graph, "CUDA targets: replay the kernels as a CUDA graph after the first run");
  app.add_option("-i,--input", inputs, "NAME=FILE.npy (or FILE.npy, in input order)");
  app.add_option("-o,--output-dir", output_dir, "write one NAME.npy per output here");
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::NonNegativeNumber);
  app.add_option("--iters", iters, "timed runs")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "worker threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "also write statistics as JSON to this file ('-' for stdout)");
  app.add_flag("--info", info, "print targets, profiles, inputs and outputs, then exit");
  app.add_flag("--profile", profile, "time every plan step and print the slowest kernels");
  app.add_flag("--no-verify", no_verify, "skip sha256 checks of package files (sizes are still checked)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  packrt::Options opt;
  opt.target = target;
  opt.num_threads = threads;
  opt.verify_checksums = !no_verify;
  opt.cuda_device = cuda_device;
  opt.cuda_graph = cuda_graph;
  packrt::Model model(package, opt);
  if (info) {
    print_info(model);
    return 0;
  }
  if (inputs.empty() && !model.inputs().empty()) {
    std::string names;
    for (auto& t : model.inputs()) names += " --input " + t.name + "=FILE.npy";
    throw UsageError("no inputs given; this model needs:" + names);
  }

  // Load inputs (name=file or positional file).
  std::vector<packrt::npy::Array> arrays;
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string spec = inputs[i], name, file = spec;
    size_t eq = spec.find('=');
    if (eq != std::string::npos) {
      name = spec.substr(0, eq);
      file = spec.substr(eq + 1);
    }
    try {
      arrays.push_back(packrt::npy::load(file));
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
    names.push_back(name);
  }
  std::vector<packrt_tensor> in(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    packrt_tensor& t = in[i];
    t = packrt_tensor{};
    t.name = names[i].empty() ? nullptr : names[i].c_str();
    t.data = arrays[i].data.get();
    t.dtype = arrays[i].dtype;
    t.ndim = static_cast<int32_t>(arrays[i].shape.size());
    if (t.ndim > PACKRT_MAX_DIMS) throw UsageError("input " + std::to_string(i) + " has too many dimensions");
    std::copy(arrays[i].shape.begin(), arrays[i].shape.end(), t.shape);
    t.nbytes = arrays[i].nbytes;
  }

  // Outputs: size buffers for the largest profile so any matching profile fits.
  std::vector<packrt::npy::Array> out_arrays;
  std::vector<packrt_tensor> out;
  auto outs0 = model.outputs(0);
  for (size_t k = 0; k < outs0.size(); ++k) {
    uint64_t cap = 0;
    for (int p = 0; p < model.num_profiles(); ++p) cap = std::max(cap, model.outputs(p)[k].nbytes);
    out_arrays.push_back(packrt::npy::Array::allocate(PACKRT_UINT8, {static_cast<int64_t>(cap)}));
    out.push_back(packrt::make_tensor(outs0[k], out_arrays.back().data.get(), cap));
    out.back().dtype = PACKRT_DTYPE_UNKNOWN;
  }

  for (int i = 0; i < warmup; ++i) model.run(in, out);
  if (profile) packrt::check(packrt_set_profiling(model.get(), 1));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    model.run(in, out);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }

  std::printf("package %s  target %s (%s)  threads %d\n", model.name().c_str(), model.target().c_str(),
              model.device().c_str(), model.num_threads());
  nlohmann::json outputs_json = nlohmann::json::array();
  for (size_t k = 0; k < out.size(); ++k) {
    std::vector<int64_t> shape(out[k].shape, out[k].shape + out[k].ndim);
    std::string file;
    if (!output_dir.empty()) {
      file = output_dir + "/" + file_safe(outs0[k].name) + ".npy";
      uint64_t nbytes = packrt_dtype_size(out[k].dtype);
      for (int64_t d : shape) nbytes *= static_cast<uint64_t>(d);
      packrt::npy::save(file, out[k].dtype, shape.data(), static_cast<int>(shape.size()), out[k].data, nbytes);
    }
    std::printf("output %s: %s %s%s%s\n", outs0[k].name.c_str(), packrt_dtype_name(out[k].dtype),
                shape_str(shape).c_str(), file.empty() ? "" : " -> ", file.c_str());
    outputs_json.push_back({{"name", outs0[k].name}, {"dtype", packrt_dtype_name(out[k].dtype)},
                            {"shape", shape}, {"file", file}});
  }
  double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  double med = percentile(ms, 0.5), p90 = percentile(ms, 0.9);
  double lo = *std::min_element(ms.begin(), ms.end()), hi = *std::max_element(ms.begin(), ms.end());
  std::printf("latency over %d runs (%d warmup): min %.3f ms  median %.3f ms  mean %.3f ms  p90 %.3f ms  max %.3f ms\n",
              iters, warmup, lo, med, mean, p90, hi);
  nlohmann::json steps_json = nlohmann::json::array();
  if (profile) {
    int p = 0;  // the profile that ran: the one with recorded runs
    for (int q = 0; q < model.num_profiles(); ++q) {
      int64_t runs = 0;
      if (packrt_num_steps(model.get(), q) > 0)
        packrt::check(packrt_step_profile(model.get(), q, 0, nullptr, nullptr, &runs));
      if (runs > 0) p = q;
    }
    struct Row {
      int step;
      std::string kernel;
      double ms;
    };
    std::vector<Row> rows;
    double total = 0;
    for (int s = 0; s < packrt_num_steps(model.get(), p); ++s) {
      const char* k = nullptr;
      double ms_total = 0;
      int64_t runs = 0;
      packrt::check(packrt_step_profile(model.get(), p, s, &k, &ms_total, &runs));
      rows.push_back({s, k, runs ? ms_total / runs : 0.0});
      total += rows.back().ms;
    }
    for (const auto& r : rows) steps_json.push_back({{"step", r.step}, {"kernel", r.kernel}, {"ms", r.ms}});
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
    std::printf("per-step time (profile %s, sum %.3f ms per run):\n", model.profile_name(p).c_str(), total);
    for (size_t i = 0; i < rows.size() && i < 15; ++i)
      std::printf("  %7.3f ms  %5.1f%%  step %3d  %s\n", rows[i].ms, total > 0 ? 100 * rows[i].ms / total : 0.0,
                  rows[i].step, rows[i].kernel.c_str());
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"steps", steps_json}, {"peak_rss_mb", peak_rss_mb()}, {"package", model.name()}, {"target", model.target()}, {"device", model.device()}, {"threads", model.num_threads()},
                        {"iters", iters}, {"warmup", warmup}, {"latency_ms", ms},
                        {"median_ms", med}, {"mean_ms", mean}, {"p90_ms", p90}, {"min_ms", lo}, {"max_ms", hi},
                        {"outputs", outputs_json}};
    if (json_path == "-") {
      std::cout << j.dump(1) << std::endl;
    } else {
      std::ofstream(json_path) << j.dump(1) << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "packrt-run: error: %s\n", e.what());
    return 2;
  } catch (const packrt::Error& e) {
    std::fprintf(stderr, "packrt-run: error: %s\n", e.what());
    return e.status() == PACKRT_ERROR_RUNTIME ? 1 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packrt-run: internal error: %s\n", e.what());
    return 1;
  }
}
