// The `cuda_mma` suite: the warp-level matrix instructions of cuda/mma.h (mma.sync.m16n8k16,
// ldmatrix, cp.async), through the probe kernels of cuda/mma_probe.cu. The fragment tables below
// are the PTX ISA's, written out here a second time, independently of the header: in the emulator
// they check the emulation, on a GPU they check both against the hardware. Every matrix entry is
// a distinct small integer, so a lane or register holding the wrong element changes an exact
// result (a wrong mapping cannot pass), and every sum is exact in float32 in any order, so the
// GPU and the emulator must agree bit for bit.
#include <doctest/doctest.h>

#include <array>
#include <vector>

#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/rng.h"
#include "cuda/mma_probe.h"
#include "cuda_kernel_check.h"
#include "qk.h"

using namespace qk;
using namespace qk::test;

namespace {

// Distinct integers in [−range, range] (a shuffled run, wrapped), as float.
std::vector<float> distinct_integers(size_t n, int range, uint64_t seed) {
    Generator gen(seed);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float(int(i % size_t(2 * range + 1)) - range);
    for (size_t i = n; i > 1; --i) std::swap(v[i - 1], v[size_t(gen.uniform() * double(i)) % i]);
    return v;
}

template <class H>
uint32_t pack(float lo, float hi) {
    return uint32_t(H(lo).bits) | uint32_t(H(hi).bits) << 16;
}

// The m16n8k16 tables: (row, column) of each lane's register halves.
struct Position {
    int row, col;
};
Position a_position(int lane, int reg, int half) {  // A: 16 × 16
    const int g = lane / 4, t = lane % 4;
    return {g + 8 * (reg % 2), 2 * t + half + 8 * (reg / 2)};
}
Position b_position(int lane, int reg, int half) {  // B: 16 (k) × 8 (n)
    const int g = lane / 4, t = lane % 4;
    return {2 * t + half + 8 * reg, g};
}
Position c_position(int lane, int i) {  // C, D: 16 × 8
    const int g = lane / 4, t = lane % 4;
    return {g + 8 * (i / 2), 2 * t + i % 2};
}

template <class H>
void check_mma(bool fp16) {
    const auto A = distinct_integers(16 * 16, 24, 1), B = distinct_integers(16 * 8, 24, 2),
               C = distinct_integers(16 * 8, 60, 3);
    std::vector<uint32_t> a(32 * 4), b(32 * 2);
    std::vector<float> c(32 * 4);
    for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < 4; ++reg) {
            const Position lo = a_position(lane, reg, 0), hi = a_position(lane, reg, 1);
            a[4 * lane + reg] = pack<H>(A[lo.row * 16 + lo.col], A[hi.row * 16 + hi.col]);
        }
        for (int reg = 0; reg < 2; ++reg) {
            const Position lo = b_position(lane, reg, 0), hi = b_position(lane, reg, 1);
            b[2 * lane + reg] = pack<H>(B[lo.row * 8 + lo.col], B[hi.row * 8 + hi.col]);
        }
        for (int i = 0; i < 4; ++i) {
            const Position p = c_position(lane, i);
            c[4 * lane + i] = C[p.row * 8 + p.col];
        }
    }
    DeviceBuffer<uint32_t> d_a(a), d_b(b);
    DeviceBuffer<float> d_c(c), d_d(32 * 4);
    cuda::mma_probe(d_d.ptr, d_a.ptr, d_b.ptr, d_c.ptr, fp16);
    const auto d = d_d.download();
    int wrong = 0;
    for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
            const Position p = c_position(lane, i);
            float want = C[p.row * 8 + p.col];
            for (int k = 0; k < 16; ++k) want += A[p.row * 16 + k] * B[k * 8 + p.col];
            if (d[4 * lane + i] != want) ++wrong;
        }
    CHECK(wrong == 0);
}

// The 8 × 8 matrix m's element (row, col): a distinct 16-bit pattern.
uint16_t element(int m, int row, int col) { return uint16_t(0x1000 * (m + 1) + 0x10 * row + col); }

void check_ldmatrix(int count, bool trans) {
    CAPTURE(count);
    CAPTURE(trans);
    std::vector<uint16_t> matrices(4 * 8 * 8);
    for (int m = 0; m < 4; ++m)
        for (int row = 0; row < 8; ++row)
            for (int col = 0; col < 8; ++col)
                matrices[(m * 8 + row) * 8 + col] = element(m, row, col);
    DeviceBuffer<uint16_t> d_matrices(matrices);
    DeviceBuffer<uint32_t> d_r(size_t(32 * count));
    cuda::ldmatrix_probe(d_r.ptr, d_matrices.ptr, count, trans);
    const auto r = d_r.download();
    int wrong = 0;
    for (int lane = 0; lane < 32; ++lane)
        for (int m = 0; m < count; ++m) {
            const int g = lane / 4, t = lane % 4;
            const uint16_t lo = trans ? element(m, 2 * t, g) : element(m, g, 2 * t);
            const uint16_t hi = trans ? element(m, 2 * t + 1, g) : element(m, g, 2 * t + 1);
            if (r[count * lane + m] != (uint32_t(lo) | uint32_t(hi) << 16)) ++wrong;
        }
    CHECK(wrong == 0);
}

// The bits of values rounded to H.
template <class H>
std::vector<uint16_t> bits_of(const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = H(x[i]).bits;
    return out;
}

// C = A·Bᵀ (B as (N, K)) or A·B (B as (K, N)) by mma_gemm against matmul of the same rounded
// values; exact on integers, else within float32's reordering of K exact products.
template <class H>
void check_gemm(int64_t M, int64_t N, int64_t K, bool b_rows_are_k, bool integers, bool fp16) {
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    CAPTURE(b_rows_are_k);
    CAPTURE(integers);
    std::vector<float> a = integers ? distinct_integers(size_t(M * K), 6, 4)
                                    : random_values<float>(size_t(M * K), 4),
                       b = integers ? distinct_integers(size_t(N * K), 6, 5)
                                    : random_values<float>(size_t(N * K), 5);
    for (auto* x : {&a, &b})
        for (float& v : *x) v = float(H(v));
    DeviceBuffer<uint16_t> d_a(bits_of<H>(a)), d_b(bits_of<H>(b));
    DeviceBuffer<float> d_c(size_t(M * N));
    cuda::mma_gemm(d_c.ptr, d_a.ptr, d_b.ptr, M, N, K, b_rows_are_k, fp16);
    auto as_f64 = [](const std::vector<float>& x, Shape shape) {
        return from_vector(std::vector<double>(x.begin(), x.end()), shape, kF64);
    };
    const Tensor ta = as_f64(a, {M, K});
    const Tensor tb = b_rows_are_k ? as_f64(b, {K, N}) : as_f64(b, {N, K}).transpose(0, 1);
    const auto want = matmul(ta, tb).to(kF32).to_vector<float>();
    const auto got = d_c.download();
    if (integers)
        CHECK(got == want);
    else  // K products summed in float32: |error| <= K·2^-24 · Σ|a||b|, ~K·2^-24·K here
        CHECK(max_rel_error(got, want) <= double(K) * double(K) * 0x1p-24);
}

}  // namespace

TEST_CASE("mma.sync m16n8k16: every fragment position of A, B, C and D, bf16 and fp16") {
    if (!cuda_device_or_skip()) return;
    check_mma<bf16>(false);
    check_mma<f16>(true);
}

TEST_CASE("ldmatrix x1, x2, x4, with and without .trans: every lane's registers") {
    if (!cuda_device_or_skip()) return;
    for (int count : {1, 2, 4})
        for (bool trans : {false, true}) check_ldmatrix(count, trans);
}

TEST_CASE("cp.async: the copy lands once its thread waits; the emulator shows a missing wait") {
    if (!cuda_device_or_skip()) return;
    std::vector<uint32_t> src(512);
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint32_t(i * 2654435761u);
    DeviceBuffer<uint32_t> d_src(src), d_out(src.size());
    cuda::cp_async_probe(d_out.ptr, d_src.ptr, true);
    CHECK(d_out.download() == src);
#ifdef QK_CUDA_EMULATION
    // Without the wait, the emulator's copies are still queued when the others read: old bytes.
    // (On a GPU that read is a race: whatever it gives proves nothing.)
    cuda::cp_async_probe(d_out.ptr, d_src.ptr, false);
    CHECK(d_out.download() != src);
#endif
}

TEST_CASE("a 64 x 64 x 64 GEMM of ldmatrix, cp.async and mma equals matmul") {
    if (!cuda_device_or_skip()) return;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        for (bool b_rows_are_k : {false, true}) {
            check_gemm<bf16>(64, 64, 64, b_rows_are_k, true, false);
            check_gemm<bf16>(64, 64, 64, b_rows_are_k, false, false);
        }
    }
    check_gemm<bf16>(128, 192, 48, false, false, false);  // several blocks, K not a tile multiple
    check_gemm<f16>(64, 128, 32, true, true, true);
}

TEST_CASE("mma_gemm refuses shapes off its tiles") {
    if (!cuda_device_or_skip()) return;
    DeviceBuffer<uint16_t> d(64 * 64);
    DeviceBuffer<float> c(64 * 64);
    CHECK_THROWS_WITH_AS(cuda::mma_gemm(c.ptr, d.ptr, d.ptr, 60, 64, 64, false, false),
                         doctest::Contains("multiples of 64"), Error);
}
