// Internal error type: every failure carries the C API status it maps to.
#pragma once
#include <packrt/packrt.h>

#include <stdexcept>
#include <string>

namespace packrt {

class Failure : public std::runtime_error {
 public:
  Failure(packrt_status status, const std::string& what) : std::runtime_error(what), status(status) {}
  packrt_status status;
};

[[noreturn]] inline void fail(packrt_status status, const std::string& what) { throw Failure(status, what); }

}  // namespace packrt
