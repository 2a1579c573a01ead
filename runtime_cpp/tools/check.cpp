#include "check.h"

#include <packrt/npy.hpp>
#include <packrt/packrt.hpp>

#include <nlohmann/json.hpp>

#include "../src/sha256.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace packrt_cli {
namespace {

using json = nlohmann::json;

struct Failure : std::runtime_error {   // bad input: exit 2
  using std::runtime_error::runtime_error;
};

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Failure(path + ": cannot read it");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Failure(path + ": not valid JSON (" + e.what() + ")");
  }
}

// A path from reference.json, inside the package (no absolute paths, no '..').
std::string inside(const std::string& pkg, const std::string& rel) {
  if (rel.empty() || rel[0] == '/' || ("/" + rel + "/").find("/../") != std::string::npos)
    throw Failure("reference data names a path outside the package: '" + rel + "'");
  return pkg + "/" + rel;
}

double element(const uint8_t* p, int32_t dtype, size_t i) {
  switch (dtype) {
    case PACKRT_FLOAT32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case PACKRT_FLOAT64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case PACKRT_FLOAT16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
      double v = exp == 0 ? std::ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY) : std::ldexp(mant + 1024, exp - 25);
      return (h & 0x8000) ? -v : v;
    }
    case PACKRT_INT8: return static_cast<int8_t>(p[i]);
    case PACKRT_UINT8: case PACKRT_BOOL: return p[i];
    case PACKRT_INT16: { int16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case PACKRT_INT32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case PACKRT_INT64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return static_cast<double>(v); }
    default: throw Failure(std::string("reference output of dtype ") + packrt_dtype_name(dtype) + " cannot be compared");
  }
}

struct Verdict {
  double max_abs = 0, max_rel = 0;
  bool ok = true;
};

// The same rule as `pack verify` (packager/tools/verify.py compare): every element within
// max(atol, rtol * scale) + rtol * |ref|, scale = the largest finite |ref| of the tensor; NaN and
// infinities must match; integers exactly; up to `flips` of the elements may be off; failing that,
// every element within max(step, spread) of the bound, and for a dequantized tensor (`step` > 0) at
// most kStepShare of its elements off (packager/frontend/rounding.py).
constexpr double kStepShare = 0.5;
Verdict compare(const uint8_t* ours, int32_t ours_dtype, const std::vector<int64_t>& ours_shape,
                const packrt::npy::Array& ref, double rtol, double atol, double flips, double step,
                double spread) {
  Verdict v;
  if (ours_dtype != ref.dtype || ours_shape != ref.shape) return {INFINITY, INFINITY, false};
  size_t n = ref.nbytes / std::max<size_t>(packrt_dtype_size(ref.dtype), 1);
  bool is_float = ref.dtype == PACKRT_FLOAT32 || ref.dtype == PACKRT_FLOAT64 || ref.dtype == PACKRT_FLOAT16;
  double scale = 0;
  for (size_t i = 0; is_float && i < n; ++i) {
    double b = element(ref.data.get(), ref.dtype, i);
    if (std::isfinite(b)) scale = std::max(scale, std::fabs(b));
  }
  size_t outside = 0, beyond = 0;
  const double extra = std::max(step, spread) * (1 + 1e-3);   // one allowance, not the two added up
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    double a = element(ours, ours_dtype, i), b = element(ref.data.get(), ref.dtype, i);
    double diff;
    if (!is_float) {
      diff = std::fabs(a - b);
      outside += diff != 0;
    } else {
      bool same_special = (std::isnan(a) && std::isnan(b)) || (std::isinf(b) && a == b);
      diff = same_special ? 0 : std::fabs(a - b);
      if (std::isnan(diff)) diff = INFINITY;
      finite = finite && std::isfinite(diff);
      const double bound = std::max(atol, rtol * scale) + rtol * (std::isfinite(b) ? std::fabs(b) : 0);
      outside += diff > bound;
      beyond += diff > bound + extra;
    }
    v.max_abs = std::max(v.max_abs, diff);
  }
  v.max_rel = is_float ? v.max_abs / std::max({scale, atol, 1e-30}) : v.max_abs;
  const double share = n == 0 ? 0 : static_cast<double>(outside) / static_cast<double>(n);
  v.ok = finite && (share <= flips || (extra > 0 && beyond == 0 && (step == 0 || share <= kStepShare)));
  return v;
}

struct Profile {
  std::string name;
  std::vector<std::pair<std::string, packrt::npy::Array>> inputs, outputs;
};

struct Reference {
  double rtol = 1e-4, atol = 1e-5, flips = 0;
  std::map<std::string, double> steps;   // output -> quantization step of a dequantized tensor
  std::map<std::string, double> spread;  // output -> how far the reference moves under float input noise
  std::vector<Profile> profiles;
  std::vector<std::string> targets;   // the manifest's target names
  std::map<std::string, std::pair<double, double>> target_tol;  // reduced-precision target -> (rtol, atol)

  // The tolerance `target` is checked with: its own where it was built in reduced precision.
  std::pair<double, double> tolerance(const std::string& target) const {
    auto it = target_tol.find(target);
    if (it == target_tol.end()) return {rtol, atol};
    return {std::max(rtol, it->second.first), std::max(atol, it->second.second)};
  }
};

// With `verify`, a reference file must be listed in the manifest with the sha256 it has: an edited
// reference would otherwise be reported as the package computing wrong answers.
void check_listed(const json& manifest, const std::string& pkg, const std::string& rel, bool verify) {
  if (!verify) return;
  const json files = manifest.value("files", json::object());
  if (!files.contains(rel) || !files.at(rel).is_object() || !files.at(rel).contains("sha256"))
    throw Failure(pkg + "/" + rel + " is not listed in the package's manifest; rebuild the package");
  std::ifstream f(inside(pkg, rel), std::ios::binary);
  if (!f) throw Failure(pkg + "/" + rel + ": cannot read it");
  packrt::Sha256 h;
  std::vector<char> buf(1 << 16);
  while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0)
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  if (h.hex() != files.at(rel).at("sha256").get<std::string>())
    throw Failure(pkg + "/" + rel + " is not the file the package was built with (its sha256 differs from the "
                                    "manifest's): the reference data was changed; rebuild the package");
}

Reference load_reference(const std::string& pkg, bool verify) {
  json m = read_json(pkg + "/manifest.json");
  if (!m.is_object() || !m.contains("reference"))
    throw Failure(pkg + " has no reference data (built with verify: {reference: false}, or it was over 16 MB); "
                        "rebuild with verify: {reference: true}");
  const std::string listed = m.at("reference").get<std::string>();
  std::string file = inside(pkg, listed);
  check_listed(m, pkg, listed, verify);
  json r = read_json(file);
  Reference ref;
  for (const auto& t : m.value("targets", json::array()))
    if (t.is_object() && t.contains("name") && t.at("name").is_string()) ref.targets.push_back(t.at("name").get<std::string>());
  try {
    if (r.value("format", "") != "packager-reference" || r.value("version", 0) != 1)
      throw Failure(file + ": not reference data of a version this runtime reads");
    ref.rtol = r.at("rtol").get<double>();
    ref.atol = r.at("atol").get<double>();
    ref.flips = r.value("flips", 0.0);
    const json steps = r.value("steps", json::object());   // kept alive: items() refers into it
    for (auto& [name, step] : steps.items()) ref.steps[name] = step.get<double>();
    const json spread = r.value("spread", json::object());
    for (auto& [name, s] : spread.items()) ref.spread[name] = s.get<double>();
    const json per_target = r.value("targets", json::object());
    for (auto& [name, t] : per_target.items())
      ref.target_tol[name] = {t.at("rtol").get<double>(), t.at("atol").get<double>()};
    for (const auto& p : r.at("profiles")) {
      Profile prof{p.at("name").get<std::string>(), {}, {}};
      for (auto* side : {&p.at("inputs"), &p.at("outputs")}) {
        for (auto& [name, rel] : side->items()) {
          check_listed(m, pkg, rel.get<std::string>(), verify);
          (side == &p.at("inputs") ? prof.inputs : prof.outputs)
              .emplace_back(name, packrt::npy::load(inside(pkg, rel.get<std::string>())));
        }
      }
      ref.profiles.push_back(std::move(prof));
    }
  } catch (const json::exception& e) {
    throw Failure(file + ": malformed reference data (" + e.what() + ")");
  } catch (const std::runtime_error& e) {   // npy::load
    if (dynamic_cast<const Failure*>(&e)) throw;
    throw Failure(e.what());
  }
  return ref;
}

std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

// Runs one profile of an open model and compares; returns false on a mismatch or failed run.
bool check_profile(packrt::Model& model, const Profile& prof, const Reference& ref) {
  std::vector<packrt_tensor> in, out;
  for (const auto& [name, arr] : prof.inputs) {
    packrt_tensor t{};
    t.name = name.c_str();
    t.data = arr.data.get();
    t.dtype = arr.dtype;
    t.ndim = static_cast<int32_t>(arr.shape.size());
    std::copy(arr.shape.begin(), arr.shape.end(), t.shape);
    t.nbytes = arr.nbytes;
    in.push_back(t);
  }
  std::vector<packrt::npy::Array> buffers;   // sized like the reference outputs (dtype checked after)
  for (const auto& [name, arr] : prof.outputs) {
    buffers.push_back(packrt::npy::Array::allocate(PACKRT_UINT8, {static_cast<int64_t>(arr.nbytes)}));
    packrt_tensor t{};
    t.name = name.c_str();
    t.data = buffers.back().data.get();
    t.dtype = PACKRT_DTYPE_UNKNOWN;
    t.nbytes = arr.nbytes;
    out.push_back(t);
  }
  std::string line = "  " + model.target() + "  " + prof.name + "  ";
  try {
    model.run(in, out);
  } catch (const packrt::Error& e) {
    std::printf("%sFAILED  %s\n", line.c_str(), e.what());
    return false;
  }
  Verdict all;
  std::string bad;
  const auto [rtol, atol] = ref.tolerance(model.target());
  for (size_t k = 0; k < out.size(); ++k) {
    const auto& [name, want] = prof.outputs[k];
    Verdict v = compare(static_cast<const uint8_t*>(out[k].data), out[k].dtype,
                        std::vector<int64_t>(out[k].shape, out[k].shape + out[k].ndim), want, rtol, atol, ref.flips,
                        ref.steps.count(name) ? ref.steps.at(name) : 0.0,
                        ref.spread.count(name) ? ref.spread.at(name) : 0.0);
    all.max_abs = std::max(all.max_abs, v.max_abs);
    all.max_rel = std::max(all.max_rel, v.max_rel);
    if (!v.ok) {
      all.ok = false;
      bad += (bad.empty() ? " (" : ", ") + name;
    }
  }
  const std::string own = ref.target_tol.count(model.target())
                              ? "  (rtol " + fmt(rtol) + ", atol " + fmt(atol) + ": reduced precision)" : "";
  std::printf("%s%s  max abs %s  max rel %s%s%s\n", line.c_str(), all.ok ? "ok      " : "MISMATCH", fmt(all.max_abs).c_str(),
              fmt(all.max_rel).c_str(), bad.empty() ? "" : (bad + ")").c_str(), own.c_str());
  return all.ok;
}

}  // namespace

int run_check(const CheckOptions& opt) {
  Reference ref;
  try {
    ref = load_reference(opt.package, opt.verify);
  } catch (const Failure& e) {
    std::fprintf(stderr, "packrt-run: error: %s\n", e.what());
    return 2;
  }
  std::vector<std::string> targets = opt.all_targets ? ref.targets : std::vector<std::string>{opt.target};
  std::printf("check %s against its reference data: rtol %s, atol %s (at least rtol x the tensor's max |value|)%s\n",
              opt.package.c_str(), fmt(ref.rtol).c_str(), fmt(ref.atol).c_str(),
              ref.flips > 0 ? (", up to " + fmt(100 * ref.flips) + "% of elements a quantization step off" +
                                   (ref.steps.empty() ? "" : ", dequantized outputs up to one step in up to " +
                                                                 fmt(100 * kStepShare) + "% of elements")).c_str() : "");
  int checked = 0, failed = 0;
  for (const std::string& target : targets) {
    packrt::Options o;
    o.target = target;
    o.num_threads = opt.threads;
    o.verify_checksums = opt.verify;
    o.expected_sha256 = opt.expect_sha256;
    o.cuda_device = opt.cuda_device;
    try {
      packrt::Model model(opt.package, o);
      for (const auto& prof : ref.profiles) failed += !check_profile(model, prof, ref);
      ++checked;
    } catch (const packrt::Error& e) {
      if (!opt.all_targets || e.status() != PACKRT_ERROR_UNSUPPORTED) {
        std::fprintf(stderr, "packrt-run: error: %s\n", e.what());
        return e.status() == PACKRT_ERROR_RUNTIME ? 1 : 2;
      }
      std::printf("  %s  skipped: %s\n", target.c_str(), e.what());
    }
  }
  if (failed) {
    std::fprintf(stderr, "packrt-run: error: %d target/profile check(s) failed\n", failed);
    return 1;
  }
  if (!checked) {
    std::fprintf(stderr, "packrt-run: error: no target of %s runs on this machine: nothing was checked\n",
                 opt.package.c_str());
    return 2;
  }
  return 0;
}

}  // namespace packrt_cli
