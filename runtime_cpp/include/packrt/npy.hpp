// npy.hpp: read and write NumPy .npy files (C order, little-endian), header-only.
// Used by packrt-run and the examples to exchange tensors with Python without any library.
#ifndef PACKRT_NPY_HPP_
#define PACKRT_NPY_HPP_

#include <packrt/packrt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace packrt {
namespace npy {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// An array whose data is 64-byte aligned, so the runtime can use it without a copy.
struct Array {
  int32_t dtype = PACKRT_DTYPE_UNKNOWN;
  std::vector<int64_t> shape;
  std::unique_ptr<uint8_t[], FreeDeleter> data;
  uint64_t nbytes = 0;

  static Array allocate(int32_t dtype, std::vector<int64_t> shape) {
    Array a;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.nbytes = packrt_dtype_size(dtype);
    for (int64_t d : a.shape)
      if (d < 0 || __builtin_mul_overflow(a.nbytes, static_cast<uint64_t>(d), &a.nbytes) || a.nbytes > (uint64_t(1) << 56))
        throw std::runtime_error("array shape is negative or too large");
    size_t n = (a.nbytes + 63) / 64 * 64;
    a.data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, n ? n : 64)));
    if (!a.data) throw std::bad_alloc();
    return a;
  }
};

namespace detail {

struct Descr {
  const char* descr;
  int32_t dtype;
};
inline const Descr* descrs() {
  static const Descr d[] = {{"f4", PACKRT_FLOAT32}, {"f2", PACKRT_FLOAT16}, {"f8", PACKRT_FLOAT64},
                            {"i1", PACKRT_INT8},    {"i2", PACKRT_INT16},   {"i4", PACKRT_INT32},
                            {"i8", PACKRT_INT64},   {"u1", PACKRT_UINT8},   {"b1", PACKRT_BOOL},
                            {nullptr, 0}};
  return d;
}

inline std::string field(const std::string& header, const std::string& key, const std::string& path) {
  const std::string bad = path + ": malformed .npy header (field '" + key + "')";
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw std::runtime_error(path + ": .npy header has no '" + key + "'");
  size_t colon = header.find(':', k);
  size_t start = colon == std::string::npos ? colon : header.find_first_not_of(" ", colon + 1);
  if (start == std::string::npos) throw std::runtime_error(bad);
  char open = header[start];
  size_t end = open == '(' ? header.find(')', start) : open == '\'' ? header.find('\'', start + 1)
                                                                    : header.find_first_of(",}", start);
  if (end == std::string::npos) throw std::runtime_error(bad);
  if (open == '(') return header.substr(start, end - start + 1);
  if (open == '\'') return header.substr(start + 1, end - start - 1);
  return header.substr(start, end - start);
}

// "(2, 3)" -> {2, 3}: non-negative decimal dims only (no exceptions from std::stoll, no wrap).
inline std::vector<int64_t> parse_shape(const std::string& txt, const std::string& path) {
  std::vector<int64_t> shape;
  size_t i = 1;
  while (i < txt.size()) {
    size_t j = txt.find_first_of(",)", i);
    if (j == std::string::npos) j = txt.size();
    size_t a = txt.find_first_not_of(' ', i), b = txt.find_last_not_of(' ', j - 1);
    if (a != std::string::npos && a < j) {
      int64_t d = 0;
      for (size_t c = a; c <= b; ++c) {
        if (txt[c] < '0' || txt[c] > '9' || d > (int64_t(1) << 56))
          throw std::runtime_error(path + ": .npy shape " + txt + " is not a list of non-negative sizes");
        d = d * 10 + (txt[c] - '0');
      }
      shape.push_back(d);
    }
    i = j + 1;
  }
  if (shape.size() > 8) throw std::runtime_error(path + ": .npy array has more than 8 dimensions");
  return shape;
}

}  // namespace detail

inline Array load(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(path + ": cannot open .npy file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, std::fclose);
  unsigned char magic[8];
  if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw std::runtime_error(path + ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    if (std::fread(b, 1, 2, f) != 2) throw std::runtime_error(path + ": truncated .npy header");
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    if (std::fread(b, 1, 4, f) != 4) throw std::runtime_error(path + ": truncated .npy header");
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  if (hlen > (1u << 20)) throw std::runtime_error(path + ": .npy header longer than 1 MB");
  std::string header(hlen, '\0');
  if (std::fread(&header[0], 1, hlen, f) != hlen) throw std::runtime_error(path + ": truncated .npy header");

  std::string descr = detail::field(header, "descr", path);
  if (descr.size() != 3 || descr[0] == '>')
    throw std::runtime_error(path + ": dtype '" + descr + "' is not supported (need little-endian numeric)");
  int32_t dtype = PACKRT_DTYPE_UNKNOWN;
  for (const auto* d = detail::descrs(); d->descr; ++d)
    if (descr.compare(1, 2, d->descr) == 0) dtype = d->dtype;
  if (dtype == PACKRT_DTYPE_UNKNOWN) throw std::runtime_error(path + ": dtype '" + descr + "' is not supported");
  if (detail::field(header, "fortran_order", path) != "False")
    throw std::runtime_error(path + ": Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
  std::vector<int64_t> shape = detail::parse_shape(detail::field(header, "shape", path), path);
  // the data must be in the file before anything that large is allocated
  long here = std::ftell(f);
  uint64_t need = packrt_dtype_size(dtype);
  for (int64_t d : shape)
    if (__builtin_mul_overflow(need, static_cast<uint64_t>(d), &need)) need = UINT64_MAX;
  if (here < 0 || std::fseek(f, 0, SEEK_END) != 0) throw std::runtime_error(path + ": cannot seek in .npy file");
  long size = std::ftell(f);
  if (size < here || need > static_cast<uint64_t>(size - here) || std::fseek(f, here, SEEK_SET) != 0)
    throw std::runtime_error(path + ": file is shorter than its header says");
  Array a;
  try {
    a = Array::allocate(dtype, shape);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(path + ": not enough memory for the array");
  }
  if (a.nbytes && std::fread(a.data.get(), 1, a.nbytes, f) != a.nbytes)
    throw std::runtime_error(path + ": file is shorter than its header says");
  return a;
}

inline void save(const std::string& path, int32_t dtype, const int64_t* shape, int ndim, const void* data,
                 uint64_t nbytes) {
  std::string descr;
  for (const auto* d = detail::descrs(); d->descr; ++d)
    if (d->dtype == dtype) descr = std::string(d->descr[0] == 'f' || d->descr[1] != '1' ? "<" : "|") + d->descr;
  if (descr.empty()) throw std::runtime_error(path + ": cannot save dtype " + std::to_string(dtype));
  std::string dims;
  for (int i = 0; i < ndim; ++i) dims += std::to_string(shape[i]) + (ndim == 1 || i + 1 < ndim ? "," : "");
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error(path + ": cannot write");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, std::fclose);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xff),
                           static_cast<unsigned char>(header.size() >> 8)};
  if (std::fwrite(pre, 1, 10, f) != 10 || std::fwrite(header.data(), 1, header.size(), f) != header.size() ||
      (nbytes && std::fwrite(data, 1, nbytes, f) != nbytes))
    throw std::runtime_error(path + ": write failed");
}

}  // namespace npy
}  // namespace packrt

#endif  // PACKRT_NPY_HPP_
