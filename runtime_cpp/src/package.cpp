#include "package.h"

#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "checked.h"
#include "cpu_features.h"
#include "cuda/cuda_driver.h"
#include "error.h"
#include "sha256.h"

namespace packrt {

using json = nlohmann::json;

static constexpr int kManifestVersion = 1;

static std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  if (!::realpath(p.c_str(), buf)) return {};
  return buf;
}

static std::string get_string(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": missing string field '" + key + "'");
  return it->get<std::string>();
}

static int open_inside(const std::string& root, const std::string& rel);

// manifest.json's text, opened like every package file (no symlink, regular file, bounded size).
static std::string read_manifest(const std::string& root) {
  int fd = open_inside(root, "manifest.json");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (off_t(1) << 28)) {
    ::close(fd);
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, root + "/manifest.json is not a regular file of at most 256 MB");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t r = ::read(fd, &text[got], text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  text.resize(got);
  return text;
}

// A pin as given: 64 hex digits (either case), returned in lower case.
static std::string normalized_pin(const std::string& pin) {
  std::string out;
  for (char c : pin) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (out.size() != 64 || out.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "expected sha256 '" + pin.substr(0, 80) + "' is not 64 hex digits");
  return out;
}

Package::Package(const std::string& dir, bool verify, const std::optional<std::string>& expected_sha256) {
  const std::string pin = expected_sha256 ? normalized_pin(*expected_sha256) : "";
  verify_ = verify || !pin.empty();   // a pin covers every file only if every file is checked
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(PACKRT_ERROR_NOT_FOUND, "package folder not found: '" + dir + "'");
  root_ = real_path(dir);
  std::string manifest_path = root_ + "/manifest.json";
  if (::access(manifest_path.c_str(), F_OK) != 0)
    fail(PACKRT_ERROR_NOT_FOUND, "'" + dir + "' is not a package: no manifest.json in it");
  std::string text = read_manifest(root_);
  Sha256 h;
  h.update(text.data(), text.size());
  manifest_sha256_ = h.hex();
  if (!pin.empty() && manifest_sha256_ != pin)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, manifest_path + " has sha256 " + manifest_sha256_ + ", not the pinned " + pin +
                                           ": this is not the package that was expected");
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, manifest_path + ": not valid JSON (" + e.what() + ")");
  }
  const std::string where = manifest_path;
  try {
    if (m.value("format", "") != "packager-package")
      fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": not a packager manifest (format field)");
    int version = m.contains("version") ? json_int<int>(m.at("version"), where + ": version") : 0;
    if (version != kManifestVersion)
      fail(PACKRT_ERROR_UNSUPPORTED, where + ": package format version " + std::to_string(version) +
                                         " is not supported by this runtime (it reads version " +
                                         std::to_string(kManifestVersion) + "); use the runtime shipped in the package");
    name_ = get_string(m, "name", where);
    id_ = m.value("id", "");
    for (auto& [rel, f] : m.at("files").items()) {
      files_[rel] = FileEntry{get_string(f, "sha256", where + ": files." + rel),
                              json_int<uint64_t>(f, "bytes", where + ": files." + rel)};
    }
    if (!m.contains("targets") || m.at("targets").empty()) {
      std::string parts;
      for (const auto& p : m.value("parts", nlohmann::json::array())) parts += " " + p.value("path", "");
      fail(PACKRT_ERROR_UNSUPPORTED,
           "package '" + name_ + "' has no compiled targets of its own: parts of the model run in ONNX Runtime. "
           "Load ort/model.onnx in ONNX Runtime with the package's custom-op library" +
               (parts.empty() ? std::string() : "; the compiled parts are" + parts));
    }
    for (const auto& t : m.at("targets")) {
      TargetEntry e;
      e.name = get_string(t, "name", where + ": targets[]");
      e.kind = get_string(t, "kind", where + ": target " + e.name);
      if (e.kind == "cpu" || e.kind == "cuda") {
        e.arch = get_string(t, "arch", where + ": target " + e.name);
        e.isa = t.value("isa", "");
        e.cpu_features = t.value("cpu_features", std::vector<std::string>{});
        e.plan = get_string(t, "plan", where + ": target " + e.name);
        e.kernels = get_string(t, "kernels", where + ": target " + e.name);
        e.weights = get_string(t, "weights", where + ": target " + e.name);
      }
      if (e.kind == "cuda") {
        std::string sm = get_string(t, "sm", where + ": target " + e.name);
        e.sm = sm.rfind("sm_", 0) == 0 ? std::atoi(sm.c_str() + 3) : 0;
        if (e.sm <= 0) fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": target " + e.name + " has a bad sm '" + sm + "'");
      }
      targets_.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": malformed manifest (" + e.what() + ")");
  }
}

static std::string cuda_reason(const TargetEntry& t, int cuda_device) {
  if (t.arch != host_arch()) return "is built for a " + t.arch + " host, this machine is " + host_arch();
  std::string why;
  int sm = cuda_device_sm(cuda_device, &why);
  if (sm < 0) return "cannot run: " + why;
  if (sm < t.sm)
    return "needs a GPU of sm_" + std::to_string(t.sm) + " or newer, CUDA device " + std::to_string(cuda_device) +
           " is sm_" + std::to_string(sm);
  return {};
}

const TargetEntry& Package::select_target(const std::string& wanted, packrt_device_type type, int cuda_device) const {
  std::string why;
  for (const auto& t : targets_) {
    if (!wanted.empty() && t.name != wanted) continue;
    std::string reason;
    if (t.kind != "cpu" && t.kind != "cuda") {
      reason = "is a " + t.kind + " target, which this runtime does not run";
    } else if (wanted.empty() && type == PACKRT_DEVICE_CPU && t.kind != "cpu") {
      reason = "is a " + t.kind + " target (CPU targets were asked for)";
    } else if (wanted.empty() && type == PACKRT_DEVICE_CUDA && t.kind != "cuda") {
      reason = "is a " + t.kind + " target (CUDA targets were asked for)";
    } else if (t.kind == "cuda") {
      reason = cuda_reason(t, cuda_device);
    } else if (t.arch != host_arch()) {
      reason = "is built for " + t.arch + ", this machine is " + host_arch();
    } else {
      auto missing = missing_cpu_features(t.cpu_features);
      if (!missing.empty()) {
        reason = "needs CPU features this machine lacks:";
        for (auto& f : missing) reason += " " + f;
      }
    }
    if (reason.empty()) return t;
    if (!wanted.empty()) fail(PACKRT_ERROR_UNSUPPORTED, "target '" + wanted + "' " + reason);
    why += (why.empty() ? " " : "; ") + t.name + " " + reason;
  }
  if (!wanted.empty()) {
    std::string names;
    for (const auto& t : targets_) names += (names.empty() ? "" : ", ") + t.name;
    fail(PACKRT_ERROR_INVALID_ARGUMENT, "package '" + name_ + "' has no target '" + wanted + "' (it has: " + names + ")");
  }
  fail(PACKRT_ERROR_UNSUPPORTED, "no target in package '" + name_ + "' runs on this machine (" + host_arch() +
                                     "):" + why);  // one line: "...: a needs X; b is built for aarch64"
}

const FileEntry& Package::entry(const std::string& rel) const {
  auto it = files_.find(rel);
  if (it == files_.end()) fail(PACKRT_ERROR_CORRUPT_PACKAGE, "manifest.json does not list '" + rel + "'");
  return it->second;
}

void Package::check_rel(const std::string& rel) const {
  if (rel.empty() || rel[0] == '/' || rel.find("..") != std::string::npos || rel.find('\\') != std::string::npos ||
      rel.find('\0') != std::string::npos)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, "manifest.json names a path outside the package: '" + rel + "'");
  entry(rel);
}

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// Opens a listed file once, component by component from the package root, following no symlink
// (O_NOFOLLOW at every step) and accepting only a regular file (a FIFO or a device would block or
// never end); everything after reads this descriptor, so nothing can be swapped in between.
static int open_inside(const std::string& root, const std::string& rel) {
  Fd dir;
  dir.fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir.fd < 0) fail(PACKRT_ERROR_NOT_FOUND, "cannot open package folder " + root);
  size_t start = 0;
  for (;;) {
    size_t slash = rel.find('/', start);
    std::string part = rel.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    bool last = slash == std::string::npos;
    int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (last ? O_NONBLOCK : O_DIRECTORY);
    int fd = part.empty() || part == "." ? -1 : ::openat(dir.fd, part.c_str(), flags);
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR)
        fail(PACKRT_ERROR_CORRUPT_PACKAGE, "package file '" + rel + "' goes through a symlink or a non-folder ('" +
                                               part + "'); package files must be regular files inside the package");
      fail(PACKRT_ERROR_CORRUPT_PACKAGE, "package file missing: " + root + "/" + rel);
    }
    if (last) return fd;
    ::close(dir.fd);
    dir.fd = fd;
    start = slash + 1;
  }
}

static void check_digest(Sha256& h, const FileEntry& e, const std::string& rel) {
  std::string got = h.hex();
  if (got != e.sha256)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, "package file '" + rel + "' fails its sha256 check (expected " + e.sha256 +
                                           ", got " + got + "): the package was modified or damaged");
}

AlignedBuffer Package::read(const std::string& rel, uint64_t* size) const {
  check_rel(rel);
  const FileEntry& e = entry(rel);
  Fd f;
  f.fd = open_inside(root_, rel);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode))
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, "package file '" + rel + "' is not a regular file");
  uint64_t n = static_cast<uint64_t>(st.st_size);
  if (n != e.bytes)
    fail(PACKRT_ERROR_CORRUPT_PACKAGE, "package file '" + rel + "' has " + std::to_string(n) + " bytes, manifest says " +
                                           std::to_string(e.bytes) + ": the package is truncated or was modified");
  AlignedBuffer buf;
  try {
    buf = mapped_buffer(n);
  } catch (const std::bad_alloc&) {
    fail(PACKRT_ERROR_RUNTIME, "out of memory reading package file '" + rel + "' (" + std::to_string(n) + " bytes)");
  }
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::read(f.fd, buf.get() + got, std::min<uint64_t>(n - got, uint64_t(1) << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail(PACKRT_ERROR_CORRUPT_PACKAGE, "short read from package file '" + rel + "' (it changed while loading?)");
    got += static_cast<uint64_t>(r);
  }
  if (verify_) {
    Sha256 h;
    h.update(buf.get(), n);
    check_digest(h, e, rel);
  }
  if (size) *size = n;
  return buf;
}

}  // namespace packrt
