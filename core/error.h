// qk::Error — the one exception type the library throws, and QK_CHECK, which builds its message.
//
// Every message names the op, what it got (shapes, dtypes, values) and what it expected, e.g.
//   matmul: inner dimensions differ: a is [4, 3], b is [5, 2] (expected a.shape[-1] == b.shape[-2])
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace qk {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// What an op's `case Device::cuda:` does in a build without the CUDA backend (cuda/stub.cpp).
[[noreturn]] inline void throw_built_without_cuda(const char* op) {
    throw Error(fmt::format(
        "{}: qknorm was built without CUDA support (reconfigure with -Dcuda=enabled, or "
        "-Demulate_cuda=true for the emulation on the cpu)",
        op));
}

}  // namespace qk

// QK_CHECK(cond, "op: {} ...", args...) throws qk::Error with the formatted message when cond is
// false.
#define QK_CHECK(cond, ...)                                         \
    do {                                                            \
        if (!(cond)) throw ::qk::Error(::fmt::format(__VA_ARGS__)); \
    } while (0)
