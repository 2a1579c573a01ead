// Checked numbers: every integer a package's JSON gives and every size computed from them goes
// through here, so a negative, fractional, boolean, huge or overflowing value is a clean
// PACKRT_ERROR_CORRUPT_PACKAGE naming the file and field, never a wrapped or truncated value.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "error.h"

namespace packrt {

// `v` as T if it is a JSON integer (not a float, bool or string) within T's range.
template <typename T>
T json_int(const nlohmann::json& v, const std::string& what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  constexpr auto lo = std::numeric_limits<T>::min();
  constexpr auto hi = std::numeric_limits<T>::max();
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(hi)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s >= 0 ? static_cast<uint64_t>(s) <= static_cast<uint64_t>(hi) : static_cast<int64_t>(lo) <= s)
      return static_cast<T>(s);
  }
  fail(PACKRT_ERROR_CORRUPT_PACKAGE, what + " must be an integer in [" + std::to_string(lo) + ", " +
                                         std::to_string(hi) + "], got " + v.dump());
}

// obj[key] as T (a missing key is a clean error too).
template <typename T>
T json_int(const nlohmann::json& obj, const char* key, const std::string& where) {
  auto it = obj.is_object() ? obj.find(key) : obj.end();
  if (!obj.is_object() || it == obj.end()) fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": missing integer field '" + key + "'");
  return json_int<T>(*it, where + ": field '" + key + "'");
}

// A list of integers.
template <typename T>
std::vector<T> json_ints(const nlohmann::json& v, const std::string& what) {
  if (!v.is_array()) fail(PACKRT_ERROR_CORRUPT_PACKAGE, what + " must be a list of integers, got " + v.dump());
  std::vector<T> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(json_int<T>(e, what));
  return out;
}

inline bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
inline bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace packrt
