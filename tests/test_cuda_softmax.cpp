// The `cuda_softmax` suite: cuda/softmax.cu against the cpu kernels of ops/softmax.cpp, forward
// and backward, softmax and log_softmax, with the causal mask and the soft-cap, in float32 and
// float64, under every run order of the emulator (the outputs must also be bit-identical across
// orders: the kernels' sums are fixed trees). Sizes are ragged (Tk = 37, 100, 259: not multiples
// of 32) and always span at least two blocks (4 rows per block).
#include <cstring>
#include <limits>
#include <string>

#include "cuda_kernel_check.h"
#include "cuda_parity.h"
#include "helpers.h"

using namespace qk::test;
namespace cpu = qk::cpu;
namespace cuda = qk::cuda;

namespace {

struct Geometry {
    int64_t outer, Tq, Tk;  // x: (outer, Tq, Tk), rows = outer · Tq
};
constexpr Geometry kGeometries[] = {{2, 7, 37}, {1, 5, 100}, {2, 3, 259}, {3, 1, 64}};

struct Variant {
    bool causal;
    double cap;
};
constexpr Variant kVariants[] = {{false, 0}, {true, 0}, {false, 5}, {true, 5}};

std::string describe(const Geometry& g, const Variant& v, bool is_log) {
    return fmt::format("{} x ({}, {}, {}) causal={} cap={}", is_log ? "log_softmax" : "softmax",
                       g.outer, g.Tq, g.Tk, v.causal, v.cap);
}

template <class T>
void cpu_forward(bool is_log, T* y, T* lse, const T* x, int64_t rows, int64_t Tq, int64_t Tk,
                 bool causal, T cap) {
    if (is_log)
        cpu::softmax_forward<T, true>(y, lse, x, rows, Tq, Tk, causal, cap);
    else
        cpu::softmax_forward<T, false>(y, lse, x, rows, Tq, Tk, causal, cap);
}

template <class T>
void cpu_backward(bool is_log, T* dx, const T* dy, const T* y, const T* lse, int64_t rows,
                  int64_t Tq, int64_t Tk, bool causal, T cap) {
    if (is_log)
        cpu::softmax_backward<T, true>(dx, dy, y, lse, rows, Tq, Tk, causal, cap);
    else
        cpu::softmax_backward<T, false>(dx, dy, y, lse, rows, Tq, Tk, causal, cap);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The rounded copies the float32 kernels write on request (SoftmaxOptions::rounded_copy): bf16
// and fp16 bits equal to rounding y and dx on the host, NaN and masked entries included, and y, lse
// and dx unchanged by writing them.
void check_rounded_copies(const DeviceBuffer<float>& d_x, const DeviceBuffer<float>& d_dy,
                          const DeviceBuffer<float>& d_y_ref, const DeviceBuffer<float>& d_lse_ref,
                          const Geometry& g, const Variant& v, bool is_log,
                          const std::vector<float>& y_want, const std::vector<float>& dx_want) {
    const int64_t rows = g.outer * g.Tq, n = rows * g.Tk;
    for (bool bf16 : {true, false}) {
        CAPTURE(bf16);
        DeviceBuffer<float> d_y(static_cast<size_t>(n)), d_lse(static_cast<size_t>(rows)),
            d_dx(static_cast<size_t>(n));
        const std::vector<uint16_t> garbage(static_cast<size_t>(n), 0x7FC1);  // every entry written
        DeviceBuffer<uint16_t> d_y_half(garbage), d_dx_half(garbage);
        cuda::softmax_forward<float>(d_y.ptr, d_lse.ptr, d_x.ptr, rows, g.Tq, g.Tk, v.causal,
                                     float(v.cap), is_log, d_y_half.ptr, bf16);
        cuda::softmax_backward<float>(d_dx.ptr, d_dy.ptr, d_y_ref.ptr, d_lse_ref.ptr, rows, g.Tq,
                                      g.Tk, v.causal, float(v.cap), is_log, d_dx_half.ptr, bf16);
        const auto y = d_y.download(), dx = d_dx.download();
        CHECK(same_bits(y, y_want));
        CHECK(same_bits(dx, dx_want));
        auto rounded = [bf16](const std::vector<float>& values) {
            std::vector<uint16_t> bits;
            for (float f : values) bits.push_back(bf16 ? qk::bf16(f).bits : qk::f16(f).bits);
            return bits;
        };
        CHECK(d_y_half.download() == rounded(y));
        CHECK(d_dx_half.download() == rounded(dx));
    }
}

// The materialised attention's kernels (softmax_rounded_forward / _backward): p and dS rounded,
// bit for bit the rounded copies softmax_forward and softmax_backward write from the device's own
// y and lse, NaN rows included, up to each row's chunk end, and nothing after it; every chunk size
// from one row to all of them.
void check_rounded_rows(const std::vector<float>& x, const std::vector<float>& dy,
                        const Geometry& g, const Variant& v) {
    const int64_t rows = g.outer * g.Tq, n = rows * g.Tk;
    const std::vector<uint16_t> garbage(static_cast<size_t>(n), 0x7FC1);
    DeviceBuffer<float> d_x(x), d_dy(dy), d_y(static_cast<size_t>(n)),
        d_lse(static_cast<size_t>(rows)), d_dx(static_cast<size_t>(n)),
        d_max(static_cast<size_t>(rows)), d_sum(static_cast<size_t>(rows));
    for (bool bf16 : {true, false}) {
        DeviceBuffer<uint16_t> d_y_half(garbage), d_dx_half(garbage);
        cuda::softmax_forward<float>(d_y.ptr, d_lse.ptr, d_x.ptr, rows, g.Tq, g.Tk, v.causal,
                                     float(v.cap), false, d_y_half.ptr, bf16);
        cuda::softmax_backward<float>(d_dx.ptr, d_dy.ptr, d_y.ptr, d_lse.ptr, rows, g.Tq, g.Tk,
                                      v.causal, float(v.cap), false, d_dx_half.ptr, bf16);
        const auto p_want = d_y_half.download(), ds_want = d_dx_half.download();
        for (int64_t chunk : {int64_t(1), int64_t(2), int64_t(3), g.Tq}) {
            CAPTURE(bf16);
            CAPTURE(chunk);
            DeviceBuffer<uint16_t> d_p(garbage), d_ds(garbage);
            cuda::softmax_rounded_forward(d_p.ptr, d_max.ptr, d_sum.ptr, d_x.ptr, rows, g.Tq, g.Tk,
                                          v.causal, float(v.cap), chunk, bf16);
            cuda::softmax_rounded_backward(d_ds.ptr, d_dy.ptr, d_x.ptr, d_max.ptr, d_sum.ptr, rows,
                                           g.Tq, g.Tk, v.causal, float(v.cap), chunk, bf16);
            const auto p = d_p.download(), ds = d_ds.download();
            int64_t wrong = 0, wrong_p = 0;
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = r % g.Tq;
                const int64_t width =
                    v.causal ? std::min(g.Tk, (i / chunk + 1) * chunk + g.Tk - g.Tq) : g.Tk;
                for (int64_t j = 0; j < g.Tk; ++j) {
                    const size_t at = static_cast<size_t>(r * g.Tk + j);
                    const uint16_t p_expected = j < width ? p_want[at] : garbage[at];
                    const uint16_t ds_expected = j < width ? ds_want[at] : garbage[at];
                    wrong += (p[at] != p_expected) + (ds[at] != ds_expected);
                    wrong_p += p[at] != p_expected;
                }
            }
            CAPTURE(wrong_p);
            CHECK(wrong == 0);
        }
    }
}

// Runs forward and backward of one configuration on both backends under every run order and
// checks parity and run-order independence. x: (rows, Tk) logits.
template <class T>
void check_softmax(const std::vector<T>& x, const Geometry& g, const Variant& v, bool is_log,
                   uint64_t seed) {
    const int64_t rows = g.outer * g.Tq, n = rows * g.Tk;
    const T cap = T(v.cap);
    CAPTURE(describe(g, v, is_log));
    std::vector<T> y_ref(n), lse_ref(rows), dx_ref(n);
    cpu_forward<T>(is_log, y_ref.data(), lse_ref.data(), x.data(), rows, g.Tq, g.Tk, v.causal, cap);
    const std::vector<T> dy = random_values<T>(n, seed + 1);
    cpu_backward<T>(is_log, dx_ref.data(), dy.data(), y_ref.data(), lse_ref.data(), rows, g.Tq,
                    g.Tk, v.causal, cap);

    DeviceBuffer<T> d_x(x), d_dy(dy), d_y(n), d_lse(rows), d_dx(n);
    // The backward reads the cpu's y and lse, so that it is tested on exactly the same inputs.
    DeviceBuffer<T> d_y_ref(y_ref), d_lse_ref(lse_ref);
    std::vector<T> y_first, lse_first, dx_first;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        cuda::softmax_forward<T>(d_y.ptr, d_lse.ptr, d_x.ptr, rows, g.Tq, g.Tk, v.causal, cap,
                                 is_log);
        cuda::softmax_backward<T>(d_dx.ptr, d_dy.ptr, d_y_ref.ptr, d_lse_ref.ptr, rows, g.Tq, g.Tk,
                                  v.causal, cap, is_log);
        const auto y = d_y.download(), lse = d_lse.download(), dx = d_dx.download();
        CHECK(max_rel_error(y, y_ref) <= tolerance<T>());
        CHECK(max_rel_error(lse, lse_ref) <= tolerance<T>());
        CHECK(max_rel_error(dx, dx_ref) <= tolerance<T>());
        if (y_first.empty()) {
            y_first = y, lse_first = lse, dx_first = dx;
        } else {  // fixed reduction trees: the same bits whatever order the threads ran in
            CHECK(y == y_first);
            CHECK(lse == lse_first);
            CHECK(dx == dx_first);
        }
    }
    if constexpr (std::is_same_v<T, float>) {
        check_rounded_copies(d_x, d_dy, d_y_ref, d_lse_ref, g, v, is_log, y_first, dx_first);
        if (!is_log) check_rounded_rows(x, dy, g, v);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda softmax and log_softmax match the cpu, causal and soft-capped", T, float,
                   double) {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 100;
    for (const Geometry& g : kGeometries)
        for (const Variant& v : kVariants) {
            if (v.causal && g.Tq > g.Tk) continue;
            // Scale 4: the cap at 5 bends most logits, and exp spans a wide range.
            const auto x = random_values<T>(size_t(g.outer * g.Tq * g.Tk), ++seed, 4.0);
            for (bool is_log : {false, true}) check_softmax<T>(x, g, v, is_log, seed * 7);
        }
}

TEST_CASE_TEMPLATE("cuda softmax stays finite on logits of 1e4", T, float, double) {
    if (!cuda_device_or_skip()) return;
    const Geometry g{2, 5, 37};
    const auto x = random_values<T>(size_t(g.outer * g.Tq * g.Tk), 7, 1e4);
    for (const Variant& v : {Variant{false, 0}, Variant{true, 0}, Variant{true, 50}})
        for (bool is_log : {false, true}) {
            check_softmax<T>(x, g, v, is_log, 9);
            const int64_t rows = g.outer * g.Tq, n = rows * g.Tk;
            DeviceBuffer<T> d_x(x), d_y(static_cast<size_t>(n)), d_lse(static_cast<size_t>(rows));
            cuda::softmax_forward<T>(d_y.ptr, d_lse.ptr, d_x.ptr, rows, g.Tq, g.Tk, v.causal,
                                     T(v.cap), is_log);
            const auto y = d_y.download(), lse = d_lse.download();
            bool finite = true;
            for (int64_t r = 0; r < rows; ++r) {
                finite = finite && std::isfinite(lse[r]);
                const int64_t visible = v.causal ? r % g.Tq + (g.Tk - g.Tq) + 1 : g.Tk;
                for (int64_t j = 0; j < visible; ++j)
                    finite = finite && std::isfinite(y[r * g.Tk + j]);
            }
            CHECK(finite);
        }
}

TEST_CASE_TEMPLATE("cuda softmax of a row with nothing finite to see is 0 with gradient 0", T,
                   float, double) {
    if (!cuda_device_or_skip()) return;
    // 6 rows of 40: rows 1 and 4 are all −inf; row 2 is −inf except one entry.
    const int64_t rows = 6, Tk = 40;
    auto x = random_values<T>(size_t(rows * Tk), 3);
    const T inf = std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < Tk; ++j) x[1 * Tk + j] = x[4 * Tk + j] = -inf;
    for (int64_t j = 0; j < Tk; ++j) x[2 * Tk + j] = j == 33 ? T(1.5) : -inf;
    for (bool is_log : {false, true})
        check_softmax<T>(x, Geometry{1, rows, Tk}, {false, 0}, is_log, 5);
    for (bool is_log : {false, true})
        check_softmax<T>(x, Geometry{1, rows, Tk}, {false, 3}, is_log, 5);
}

// Op level: qk::softmax / qk::log_softmax on cuda tensors against the cpu, through autograd
// (tests/cuda_parity.h: outputs and input gradients, random probe, every run order).
TEST_CASE("cuda softmax and log_softmax ops match the cpu through autograd") {
    for (qk::DType dtype : {qk::kF32, qk::kF64}) {
        const qk::Tensor x = randn_seeded({2, 7, 37}, 21, dtype, 4.0);
        for (const qk::SoftmaxOptions& o :
             {qk::SoftmaxOptions{}, qk::SoftmaxOptions{true, 0}, qk::SoftmaxOptions{true, 5}}) {
            CAPTURE(o.causal);
            CAPTURE(o.softcap);
            check_cuda_parity("softmax", [o](const Inputs& in) { return qk::softmax(in[0], o); },
                              {x});
            check_cuda_parity("log_softmax",
                              [o](const Inputs& in) { return qk::log_softmax(in[0], o); }, {x});
        }
        // A non-contiguous input (softmax over a transposed view): contiguous() on the device.
        const qk::Tensor xt = randn_seeded({37, 6}, 22, dtype, 2.0);
        check_cuda_parity("softmax of a transposed view",
                          [](const Inputs& in) {
                              return qk::softmax(in[0].t(), {false, 3});
                          },
                          {xt});
    }
}

TEST_CASE_TEMPLATE("cuda softmax of a row with a NaN or +inf is NaN where visible, as on the cpu",
                   T, float, double) {
    if (!cuda_device_or_skip()) return;
    // (1, 6, 40), with and without the causal mask: row 1 all NaN, row 3 one NaN at a visible
    // key, row 4 one +inf; row 0 a NaN at key 37, which the causal row 0 (keys <= 34) never sees.
    const int64_t rows = 6, Tk = 40;
    auto x = random_values<T>(size_t(rows * Tk), 11);
    for (int64_t j = 0; j < Tk; ++j) x[1 * Tk + j] = std::numeric_limits<T>::quiet_NaN();
    x[3 * Tk + 17] = std::numeric_limits<T>::quiet_NaN();
    x[4 * Tk + 2] = std::numeric_limits<T>::infinity();
    x[0 * Tk + 37] = std::numeric_limits<T>::quiet_NaN();
    const std::vector<T> dy = random_values<T>(size_t(rows * Tk), 12);
    for (bool causal : {false, true})
        for (bool is_log : {false, true}) {
            CAPTURE(causal);
            CAPTURE(is_log);
            std::vector<T> y_ref(rows * Tk), lse_ref(rows), dx_ref(rows * Tk);
            cpu_forward<T>(is_log, y_ref.data(), lse_ref.data(), x.data(), rows, rows, Tk, causal,
                           T(0));
            cpu_backward<T>(is_log, dx_ref.data(), dy.data(), y_ref.data(), lse_ref.data(), rows,
                            rows, Tk, causal, T(0));
            CHECK(std::isnan(lse_ref[1]));
            CHECK(std::isnan(lse_ref[3]));
            CHECK(std::isnan(lse_ref[4]));
            CHECK(std::isnan(lse_ref[0]) == !causal);  // the masked NaN is not seen
            CHECK(std::isfinite(lse_ref[2]));
            const size_t n = static_cast<size_t>(rows * Tk);
            DeviceBuffer<T> d_x(x), d_dy(dy), d_y(n), d_lse(static_cast<size_t>(rows)), d_dx(n),
                d_y_ref(y_ref), d_lse_ref(lse_ref);
            for (Order order : kOrders) {
                CAPTURE(order_name(order));
                RunOrderScope scope(order);
                cuda::softmax_forward<T>(d_y.ptr, d_lse.ptr, d_x.ptr, rows, rows, Tk, causal, T(0),
                                         is_log);
                cuda::softmax_backward<T>(d_dx.ptr, d_dy.ptr, d_y_ref.ptr, d_lse_ref.ptr, rows,
                                          rows, Tk, causal, T(0), is_log);
                const auto y = d_y.download(), lse = d_lse.download(), dx = d_dx.download();
                auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
                    for (size_t i = 0; i < a.size(); ++i) {
                        if (std::isnan(a[i]) != std::isnan(b[i])) return false;
                        if (!std::isnan(a[i]) && a[i] != b[i] &&
                            std::abs(a[i] - b[i]) > tolerance<T>() * (1 + std::abs(b[i])))
                            return false;
                    }
                    return true;
                };
                CHECK(same(y, y_ref));
                CHECK(same(lse, lse_ref));
                CHECK(same(dx, dx_ref));
            }
            if constexpr (std::is_same_v<T, float>)
                if (!is_log) check_rounded_rows(x, dy, Geometry{1, rows, Tk}, {causal, 0});
        }
}

TEST_CASE("cuda softmax keeps its rounded copy beside p for the mixed GEMM that reads it next") {
    if (!cuda_device_or_skip()) return;
    const qk::Tensor x = randn_seeded({2, 7, 37}, 23, qk::kF32, 4.0).to(qk::Device::cuda);
    const qk::Tensor p = qk::softmax(x, {.causal = true, .rounded_copy = qk::Precision::bf16});
    const auto& kept = p.storage()->cast_copy();
    REQUIRE(kept.storage != nullptr);
    CHECK(kept.dtype == qk::kBF16);
    const auto kept_storage = kept.storage;
    const qk::Tensor copy = qk::cast_once(p, qk::kBF16);
    CHECK(copy.storage() == kept_storage);  // returned as kept: no rounding pass of its own
    CHECK(max_abs_diff(copy.to(qk::kF32), p.to(qk::kBF16).to(qk::kF32)) == 0);
    // Written in place, p's values change and the copy no longer serves.
    qk::mark_written(p);
    CHECK(qk::cast_once(p, qk::kBF16).storage() != kept_storage);
    // Elsewhere nothing is written beside p: the GEMM rounds it when it reads it.
    const qk::Tensor p_cpu =
        qk::softmax(x.to(qk::Device::cpu), {.rounded_copy = qk::Precision::bf16});
    CHECK(p_cpu.storage()->cast_copy().storage == nullptr);
}
