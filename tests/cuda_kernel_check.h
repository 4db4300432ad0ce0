// Kernel-level parity checks for the CUDA row kernels (tests/test_cuda_{softmax,loss,norm}.cpp):
// device buffers filled from host vectors, the run orders of the emulator, and a relative error.
// The op-level tests go through Tensor::to(Device::cuda); these call the launchers directly, so a
// failure points at a kernel, not at the tensor plumbing around it.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "cuda/runtime.h"

namespace qk::test {

// A device copy of a host vector, freed at scope exit; download() brings it back.
template <class T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
        QK_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)));
        cuda::copy_to_device(ptr, host.data(), n * sizeof(T));
    }
    explicit DeviceBuffer(size_t count) : DeviceBuffer(std::vector<T>(count, T(0))) {}
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaFree(ptr); }
    std::vector<T> download() const {
        std::vector<T> host(n);
        cuda::copy_to_host(host.data(), ptr, n * sizeof(T));
        return host;
    }
};

// The run orders to test under: the emulator's three (forward, reverse, seeded random), or just
// the real device's own.
enum class Order { forward, reverse, random };
#ifdef QK_CUDA_EMULATION
inline const std::vector<Order> kOrders = {Order::forward, Order::reverse, Order::random};
#else
inline const std::vector<Order> kOrders = {Order::forward};
#endif

// Sets a run order for one scope and puts forward back after (the suite's default).
struct RunOrderScope {
    explicit RunOrderScope([[maybe_unused]] Order order) {
#ifdef QK_CUDA_EMULATION
        const emu::RunOrder o = order == Order::forward   ? emu::RunOrder::forward
                                : order == Order::reverse ? emu::RunOrder::reverse
                                                          : emu::RunOrder::random;
        emu::set_run_order(o, 20240613);
#endif
    }
    ~RunOrderScope() {
#ifdef QK_CUDA_EMULATION
        emu::set_run_order(emu::RunOrder::forward, 0);
#endif
    }
    RunOrderScope(const RunOrderScope&) = delete;
    RunOrderScope& operator=(const RunOrderScope&) = delete;
};

inline const char* order_name(Order o) {
    return o == Order::forward ? "forward" : o == Order::reverse ? "reverse" : "random";
}

// True when kernels can run; else a visible MESSAGE (a real-CUDA build on a machine without GPU).
inline bool cuda_device_or_skip() {
    if (cuda::device_available()) return true;
    MESSAGE("skipped: no CUDA device (" << cuda::backend_description() << ")");
    return false;
}

// n values from N(0, scale²), drawn with a fixed seed, as T.
template <class T>
std::vector<T> random_values(size_t n, uint64_t seed, double scale = 1.0) {
    Generator gen(seed);
    std::vector<T> v(n);
    for (auto& x : v) x = T(scale * gen.normal());
    return v;
}

// max |a − b| / max(1, max |b|), with equal infinities (same sign) counting as equal and a NaN
// on either side as an infinite error.
template <class T>
double max_rel_error(const std::vector<T>& a, const std::vector<T>& b) {
    REQUIRE(a.size() == b.size());
    double scale = 1, worst = 0;
    for (T v : b)
        if (std::isfinite(v)) scale = std::max(scale, std::abs(double(v)));
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
        if (std::isinf(a[i]) || std::isinf(b[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / scale);
    }
    return worst;
}

// The parity tolerance for T: float kernels sum in a different order than the cpu's 16 lanes.
template <class T>
constexpr double tolerance() {
    return sizeof(T) == 4 ? 3e-6 : 1e-13;
}

}  // namespace qk::test
