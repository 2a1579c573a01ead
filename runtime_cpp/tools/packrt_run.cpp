// packrt-run: run a package from .npy inputs, write .npy outputs, print latency statistics.
//   packrt-run PKG [--target NAME] --input NAME=FILE.npy ... [--output-dir DIR]
//              [--warmup N] [--iters N] [--threads N] [--json FILE] [--info] [--expect-sha256 HEX]
//   packrt-run PKG --check [--target NAME | --all-targets]   (against the package's reference data)
// Exit codes: 0 ok, 2 bad input (arguments, files, shapes, package), 1 runtime failure.
#include <packrt/npy.hpp>
#include <packrt/packrt.hpp>

#include <CLI/CLI.hpp>

#include "check.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
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
  std::printf("manifest sha256: %s (pin it with --expect-sha256)\n", m.manifest_sha256().c_str());
  for (int p = 0; p < m.num_profiles(); ++p) {
    std::printf("profile %s\n", m.profile_name(p).c_str());
    for (auto& t : m.inputs(p))
      std::printf("  input  %s: %s %s\n", t.name.c_str(), packrt_dtype_name(t.dtype), shape_str(t.shape).c_str());
    for (auto& t : m.outputs(p))
      std::printf("  output %s: %s %s\n", t.name.c_str(), packrt_dtype_name(t.dtype), shape_str(t.shape).c_str());
  }
}

// Command line.
struct Args {
  std::string package, target, output_dir, json_path;
  std::optional<std::string> expect_sha256;   // given (even empty): pin the manifest
  std::vector<std::string> inputs;
  int warmup = 1, iters = 10, threads = 0, cuda_device = 0;
  bool cuda_graph = false;
  bool info = false, no_verify = false, profile = false, check = false, all_targets = false;
};

// Parses the command line into `a`. Returns -1 to go on, else the exit code (0 after --help).
int parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"Run a packaged model from .npy inputs (packager runtime " + std::string(packrt_version()) + ")"};
  app.add_option("package", a.package, "package folder")->required();
  auto* target = app.add_option("--target", a.target, "target to run (default: the first that runs on this machine)");
  app.add_option("--cuda-device", a.cuda_device, "CUDA device ordinal for CUDA targets")->check(CLI::Range(0, 1 << 16));
  app.add_flag("--cuda-graph", a.cuda_graph, "CUDA targets: replay the kernels as a CUDA graph after the first run");
  app.add_option("-i,--input", a.inputs, "NAME=FILE.npy (or FILE.npy, in input order)");
  app.add_option("-o,--output-dir", a.output_dir, "write one NAME.npy per output here");
  app.add_option("--warmup", a.warmup, "untimed runs first")->check(CLI::Range(0, INT_MAX));
  app.add_option("--iters", a.iters, "timed runs")->check(CLI::Range(1, INT_MAX));
  app.add_option("--threads", a.threads, "worker threads (0: all cores)")->check(CLI::Range(0, PACKRT_MAX_THREADS));
  app.add_option("--json", a.json_path, "also write statistics as JSON to this file ('-' for stdout)");
  app.add_flag("--info", a.info, "print targets, profiles, inputs and outputs, then exit");
  app.add_flag("--check", a.check,
               "run the target on the reference inputs stored in the package and compare with its reference "
               "outputs (exit 1 on a mismatch)");
  app.add_flag("--all-targets", a.all_targets, "with --check: every target that runs on this machine")
      ->needs("--check")
      ->excludes(target);
  app.add_flag("--profile", a.profile, "time every plan step and print the slowest kernels");
  auto* no_verify = app.add_flag("--no-verify", a.no_verify, "skip sha256 checks of package files (sizes are still checked)");
  app.add_option("--expect-sha256", a.expect_sha256,
                 "run only the package whose manifest.json has this sha256 (see --info); checks the sha256 of "
                 "every file the run uses")
      ->excludes(no_verify);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);   // --help
    std::string msg = e.what();                       // one line, like every other error
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "packrt-run: error: %s (see --help)\n", msg.c_str());
    return 2;
  }
  return -1;
}

packrt::Model open_model(const Args& a) {
  packrt::Options opt;
  opt.target = a.target;
  opt.num_threads = a.threads;
  opt.verify_checksums = !a.no_verify;
  opt.expected_sha256 = a.expect_sha256;
  opt.cuda_device = a.cuda_device;
  opt.cuda_graph = a.cuda_graph;
  return packrt::Model(a.package, opt);
}

// Input tensors over .npy files.
struct Inputs {
  std::vector<packrt::npy::Array> arrays;
  std::vector<std::string> names;  // empty: by position
  std::vector<packrt_tensor> tensors;
};

// Loads inputs (name=file or positional file).
void load_inputs(const std::vector<std::string>& specs, Inputs& in) {
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string spec = specs[i], name, file = spec;
    size_t eq = spec.find('=');
    if (eq != std::string::npos) {
      name = spec.substr(0, eq);
      file = spec.substr(eq + 1);
    }
    try {
      in.arrays.push_back(packrt::npy::load(file));
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
    in.names.push_back(name);
  }
  in.tensors.resize(in.arrays.size());
  for (size_t i = 0; i < in.arrays.size(); ++i) {
    packrt_tensor& t = in.tensors[i];
    t = packrt_tensor{};
    t.name = in.names[i].empty() ? nullptr : in.names[i].c_str();
    t.data = in.arrays[i].data.get();
    t.dtype = in.arrays[i].dtype;
    t.ndim = static_cast<int32_t>(in.arrays[i].shape.size());
    if (t.ndim > PACKRT_MAX_DIMS) throw UsageError("input " + std::to_string(i) + " has too many dimensions");
    std::copy(in.arrays[i].shape.begin(), in.arrays[i].shape.end(), t.shape);
    t.nbytes = in.arrays[i].nbytes;
  }
}

// Output buffers, one per output of the model (named as in profile 0).
struct Outputs {
  std::vector<packrt::TensorInfo> infos;
  std::vector<packrt::npy::Array> arrays;
  std::vector<packrt_tensor> tensors;
};

// Sizes buffers for the largest profile so any matching profile fits.
void allocate_outputs(const packrt::Model& model, Outputs& out) {
  out.infos = model.outputs(0);
  for (size_t k = 0; k < out.infos.size(); ++k) {
    uint64_t cap = 0;
    for (int p = 0; p < model.num_profiles(); ++p) cap = std::max(cap, model.outputs(p)[k].nbytes);
    out.arrays.push_back(packrt::npy::Array::allocate(PACKRT_UINT8, {static_cast<int64_t>(cap)}));
    out.tensors.push_back(packrt::make_tensor(out.infos[k], out.arrays.back().data.get(), cap));
    out.tensors.back().dtype = PACKRT_DTYPE_UNKNOWN;
  }
}

// Untimed warm-up runs, then --iters timed ones (per-step profiling on if asked): their latencies.
std::vector<double> time_runs(packrt::Model& model, const Args& a, const Inputs& in, Outputs& out) {
  for (int i = 0; i < a.warmup; ++i) model.run(in.tensors, out.tensors);
  if (a.profile) packrt::check(packrt_set_profiling(model.get(), 1));
  std::vector<double> ms;
  for (int i = 0; i < a.iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    model.run(in.tensors, out.tensors);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

// Prints every output (writing NAME.npy into `output_dir` if given); returns them as JSON.
nlohmann::json write_outputs(const Outputs& out, const std::string& output_dir) {
  nlohmann::json outputs_json = nlohmann::json::array();
  for (size_t k = 0; k < out.tensors.size(); ++k) {
    const packrt_tensor& t = out.tensors[k];
    const std::string& name = out.infos[k].name;
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    std::string file;
    if (!output_dir.empty()) {
      file = output_dir + "/" + file_safe(name) + ".npy";
      uint64_t nbytes = packrt_dtype_size(t.dtype);
      for (int64_t d : shape) nbytes *= static_cast<uint64_t>(d);
      try {
        packrt::npy::save(file, t.dtype, shape.data(), static_cast<int>(shape.size()), t.data, nbytes);
      } catch (const std::runtime_error& e) {
        throw UsageError(std::string("cannot write an output: ") + e.what());
      }
    }
    std::printf("output %s: %s %s%s%s\n", name.c_str(), packrt_dtype_name(t.dtype), shape_str(shape).c_str(),
                file.empty() ? "" : " -> ", file.c_str());
    outputs_json.push_back({{"name", name}, {"dtype", packrt_dtype_name(t.dtype)}, {"shape", shape}, {"file", file}});
  }
  return outputs_json;
}

struct Latency {
  double mean, median, p90, min, max;
};

// Prints min/median/mean/p90/max of the timed runs.
Latency report_latency(const std::vector<double>& ms, const Args& a) {
  Latency l;
  l.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  l.median = percentile(ms, 0.5);
  l.p90 = percentile(ms, 0.9);
  l.min = *std::min_element(ms.begin(), ms.end());
  l.max = *std::max_element(ms.begin(), ms.end());
  std::printf("latency over %d runs (%d warmup): min %.3f ms  median %.3f ms  mean %.3f ms  p90 %.3f ms  max %.3f ms\n",
              a.iters, a.warmup, l.min, l.median, l.mean, l.p90, l.max);
  return l;
}

// --profile: prints the slowest steps of the profile that ran; returns every step's mean time as JSON.
nlohmann::json report_steps(const packrt::Model& model) {
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
  nlohmann::json steps_json = nlohmann::json::array();
  for (const auto& r : rows) steps_json.push_back({{"step", r.step}, {"kernel", r.kernel}, {"ms", r.ms}});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  std::printf("per-step time (profile %s, sum %.3f ms per run):\n", model.profile_name(p).c_str(), total);
  for (size_t i = 0; i < rows.size() && i < 15; ++i)
    std::printf("  %7.3f ms  %5.1f%%  step %3d  %s\n", rows[i].ms, total > 0 ? 100 * rows[i].ms / total : 0.0,
                rows[i].step, rows[i].kernel.c_str());
  return steps_json;
}

// --json: the statistics to a file, or stdout for '-'.
void write_json(const std::string& path, const nlohmann::json& j) {
  if (path == "-") {
    std::cout << j.dump(1) << std::endl;
    return;
  }
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  f.close();
  if (!f) throw UsageError("--json " + path + ": cannot write it");
}

// Fails before anything runs when --output-dir or --json cannot be written.
void check_output_paths(const Args& a) {
  if (!a.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.output_dir, ec);   // like `mkdir -p`
    if (!std::filesystem::is_directory(a.output_dir))
      throw UsageError("--output-dir " + a.output_dir + ": " +
                       (std::filesystem::exists(a.output_dir) ? "exists and is not a folder"
                                                              : "cannot create it (" + ec.message() + ")"));
  }
  if (!a.json_path.empty() && a.json_path != "-") {
    std::ofstream f(a.json_path, std::ios::app);              // does not truncate a file it cannot replace yet
    if (!f) throw UsageError("--json " + a.json_path + ": cannot write it (" + std::strerror(errno) + ")");
  }
}

int run(int argc, char** argv) {
  Args a;
  if (int rc = parse_args(argc, argv, a); rc >= 0) return rc;
  if (a.check)
    return packrt_cli::run_check({a.package, a.target, a.expect_sha256, a.all_targets, !a.no_verify, a.threads,
                                  a.cuda_device});
  check_output_paths(a);
  packrt::Model model = open_model(a);
  if (a.info) {
    print_info(model);
    return 0;
  }
  if (a.inputs.empty() && !model.inputs().empty()) {
    std::string names;
    for (auto& t : model.inputs()) names += " --input " + t.name + "=FILE.npy";
    throw UsageError("no inputs given; this model needs:" + names);
  }
  Inputs in;
  load_inputs(a.inputs, in);
  Outputs out;
  allocate_outputs(model, out);

  std::vector<double> ms = time_runs(model, a, in, out);

  std::printf("package %s  target %s (%s)  threads %d\n", model.name().c_str(), model.target().c_str(),
              model.device().c_str(), model.num_threads());
  nlohmann::json outputs_json = write_outputs(out, a.output_dir);
  Latency l = report_latency(ms, a);
  nlohmann::json steps_json = a.profile ? report_steps(model) : nlohmann::json::array();
  if (!a.json_path.empty()) {
    nlohmann::json j = {{"steps", steps_json}, {"peak_rss_mb", peak_rss_mb()}, {"package", model.name()},
                        {"target", model.target()}, {"device", model.device()}, {"threads", model.num_threads()},
                        {"iters", a.iters}, {"warmup", a.warmup}, {"latency_ms", ms}, {"median_ms", l.median},
                        {"mean_ms", l.mean}, {"p90_ms", l.p90}, {"min_ms", l.min}, {"max_ms", l.max},
                        {"outputs", outputs_json}};
    write_json(a.json_path, j);
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
