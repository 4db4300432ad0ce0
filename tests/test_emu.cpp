// The `emu` suite: the CUDA emulation layer (cuda/emu) runs the self-test kernels of
// tests/emu_selftest_kernels.cpp with real block semantics, catches the planted bugs, and its
// cuBLAS shim matches a naive column-major GEMM and cuBLAS's argument rules.
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "cuda/emu/cublas_compat.h"
#include "cuda/emu/cublaslt_compat.h"
#include "emu_selftest_kernels.h"
#include "helpers.h"

using qk::test::throws_with;
namespace es = emu_selftest;

namespace {

// Sets the run order for one test and puts the previous one back.
struct OrderGuard {
    qk::emu::RunOrder saved = qk::emu::run_order();
    uint64_t seed = qk::emu::run_order_seed();
    explicit OrderGuard(qk::emu::RunOrder order, uint64_t s = 0) {
        qk::emu::set_run_order(order, s);
    }
    ~OrderGuard() { qk::emu::set_run_order(saved, seed); }
};

std::vector<float> ramp(int n, float scale = 1.0f) {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = scale * static_cast<float>((i * 7) % 13 - 6);
    return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr qk::emu::RunOrder kOrders[] = {qk::emu::RunOrder::forward, qk::emu::RunOrder::reverse,
                                         qk::emu::RunOrder::random};

}  // namespace

TEST_CASE("threadIdx / blockIdx / blockDim / gridDim over a ragged 3-D launch") {
    const dim3 grid(3, 2, 2), block(5, 3, 2);
    for (auto order : kOrders) {
        OrderGuard guard(order, 7);
        const auto out = es::index_map(grid, block);
        const unsigned nthreads = 5 * 3 * 2, nblocks = 3 * 2 * 2;
        REQUIRE(out.size() == nthreads * nblocks * 6 + 4);
        bool ok = true;
        for (unsigned b = 0; b < nblocks; ++b)
            for (unsigned t = 0; t < nthreads; ++t) {
                const unsigned* o = &out[6 * (b * nthreads + t)];
                ok = ok && o[0] == t % 5 && o[1] == (t / 5) % 3 && o[2] == t / 15;
                ok = ok && o[3] == b % 3 && o[4] == (b / 3) % 2 && o[5] == b / 6;
            }
        CHECK(ok);
        const unsigned* tail = &out[nthreads * nblocks * 6];
        CHECK(tail[0] == nthreads);
        CHECK(tail[1] == 3);
        CHECK(tail[2] == 2);
        CHECK(tail[3] == 2);
    }
    // A 2-D launch with ragged x.
    const auto out = es::index_map(dim3(2, 3), dim3(7, 2));
    CHECK(out[6 * (5 * 14 + 13) + 0] == 6);  // block (1,2) thread (6,1)
    CHECK(out[6 * (5 * 14 + 13) + 1] == 1);
    CHECK(out[6 * (5 * 14 + 13) + 3] == 1);
    CHECK(out[6 * (5 * 14 + 13) + 4] == 2);
}

TEST_CASE("a shared-memory tree reduction with __syncthreads is the same under every run order") {
    const auto x = ramp(300, 0.25f);  // 5 blocks, the last one ragged
    std::vector<float> expected(5, 0.0f);
    for (int i = 0; i < 300; ++i) expected[i / 64] += x[i];
    std::vector<float> first;
    for (auto order : kOrders) {
        OrderGuard guard(order, 12345);
        const auto sums = es::block_sums(x, true);
        REQUIRE(sums.size() == 5);
        for (int b = 0; b < 5; ++b) CHECK(sums[b] == doctest::Approx(expected[b]));
        if (first.empty()) first = sums;
        CHECK(same_bits(sums, first));
    }
}

TEST_CASE("planted bug 1: a reduction without __syncthreads differs between run orders") {
    const auto x = ramp(300, 0.25f);
    std::vector<float> forward, reverse;
    {
        OrderGuard guard(qk::emu::RunOrder::forward);
        forward = es::block_sums(x, false);
    }
    {
        OrderGuard guard(qk::emu::RunOrder::reverse);
        reverse = es::block_sums(x, false);
    }
    CHECK_FALSE(same_bits(forward, reverse));
}

TEST_CASE("warp shuffles: down and xor reductions, up scan, broadcast, width, ballot") {
    const int n = 250;  // 3 blocks of 96, the last ragged
    const auto x = ramp(n);
    auto x_at = [&](int i) { return i < n ? x[i] : 0.0f; };
    for (auto order : kOrders) {
        OrderGuard guard(order, 99);
        const auto down = es::warp_sums_down(x);
        const auto bfly = es::warp_sums_xor(x);
        bool ok_down = true, ok_xor = true;
        for (int w = 0; w < static_cast<int>(down.size()); ++w) {
            float s = 0;
            for (int l = 0; l < 32; ++l) s += x_at(32 * w + l);
            ok_down = ok_down && down[w] == s;
            for (int l = 0; l < 32; ++l) ok_xor = ok_xor && bfly[32 * w + l] == s;
        }
        CHECK(ok_down);
        CHECK(ok_xor);

        const auto misc = es::warp_misc(x);
        bool ok_scan = true, ok_bcast = true, ok_group = true, ok_ballot = true;
        for (int i = 0; i < static_cast<int>(misc.scan.size()); ++i) {
            const int w0 = i / 32 * 32, lane = i % 32, g0 = i / 8 * 8;
            float scan = 0, group = 0;
            unsigned ballot = 0;
            for (int l = 0; l <= lane; ++l) scan += x_at(w0 + l);
            for (int l = 0; l < 8; ++l) group += x_at(g0 + l);
            for (int l = 0; l < 32; ++l) ballot |= (x_at(w0 + l) > 0 ? 1u : 0u) << l;
            ok_scan = ok_scan && misc.scan[i] == scan;
            ok_bcast = ok_bcast && misc.broadcast[i] == x_at(w0 + 3);
            ok_group = ok_group && misc.group8[i] == group;
            ok_ballot = ok_ballot && misc.ballot[i] == ballot;
        }
        CHECK(ok_scan);
        CHECK(ok_bcast);
        CHECK(ok_group);
        CHECK(ok_ballot);
    }
}

TEST_CASE("dynamic shared memory starts as NaN and is shared by the block") {
    const auto x = ramp(45);
    std::vector<float> before, reversed;
    es::dynamic_smem(x, before, reversed);
    REQUIRE(before.size() == 45);
    CHECK(std::all_of(before.begin(), before.end(), [](float v) { return std::isnan(v); }));
    for (int i = 0; i < 45; ++i) CHECK(reversed[i] == x[44 - i]);
    CHECK(throws_with([] { es::dynamic_smem_overflow(); },
                      {"cuda emulation: kernel 'smem_overflow_kernel'", "dynamic shared memory"}));
}

TEST_CASE("atomicAdd and atomicMax over many blocks, on one worker and on a pool") {
    const auto x = ramp(1000);  // integer values: the float sum is exact in any order
    const float expected = std::accumulate(x.begin(), x.end(), 0.0f);
    for (int workers : {1, 2}) {
        qk::emu::set_workers(workers);
        OrderGuard guard(qk::emu::RunOrder::random, 5);
        CHECK(es::atomic_sum(x) == expected);
        CHECK(es::atomic_count(37, 45) == 37 * 45);
        std::vector<int> xi(333);
        for (int i = 0; i < 333; ++i) xi[i] = (i * 7919) % 1009 - 500;
        CHECK(es::atomic_max(xi) == *std::max_element(xi.begin(), xi.end()));
    }
    qk::emu::set_workers(1);
}

TEST_CASE("planted bug 2: a write one element past a cudaMalloc allocation names the kernel") {
    const auto live = qk::emu::live_device_bytes();
    CHECK(throws_with(
        [] { es::write_one_past_end(100); },
        {"cuda emulation: kernel 'fill_off_by_one_kernel'",
         "past the end of a device allocation of 400 bytes", "bytes 0 to 3 past the end"}));
    CHECK(qk::emu::live_device_bytes() == live);  // the buffer was freed during unwinding
    // Every address's red zone sees the whole float: 1.0f's bytes (00 00 80 3F) are never a
    // canary, whatever address the allocation lands on (one in 128 tries once missed one).
    for (int n = 1; n <= 200; ++n)
        CHECK(throws_with(
            [n] { es::write_one_past_end(n); },
            {fmt::format("device allocation of {} bytes", 4 * n), "bytes 0 to 3 past the end"}));
}

TEST_CASE("planted bug 3: host and freed pointers as kernel arguments are reported") {
    CHECK(throws_with([] { es::pass_host_pointer(50); },
                      {"cuda emulation: kernel 'fill_kernel'", "argument 0 is a host pointer"}));
    CHECK(throws_with([] { es::pass_freed_pointer(50); },
                      {"cuda emulation: kernel 'fill_kernel'", "freed device memory"}));
}

TEST_CASE("planted bug 4: divergent __syncthreads is reported with its site") {
    for (auto order : kOrders) {
        OrderGuard guard(order, 3);
        CHECK(throws_with(
            [] { es::syncthreads_in_branch(); },
            {"cuda emulation: kernel 'sync_in_branch_kernel' block (", "divergent __syncthreads",
             "16 threads at __syncthreads at ", "emu_selftest_kernels.cpp:", "16 threads exited"}));
        CHECK(throws_with(
            [] { es::syncthreads_at_two_sites(); },
            {"cuda emulation: kernel 'sync_two_sites_kernel'", "divergent __syncthreads",
             "different barriers", "emu_selftest_kernels.cpp:"}));
    }
}

TEST_CASE("shuffles naming exited lanes, and deadlocks, are reported") {
    for (auto order : kOrders) {
        OrderGuard guard(order, 4);
        // Under the random order only the lanes that exited so far are named.
        const std::string lanes = order == qk::emu::RunOrder::random ? "lanes " : "lanes 0-15";
        CHECK(throws_with([] { es::shuffle_with_exited_lanes(); },
                          {"cuda emulation: kernel 'shuffle_exited_kernel'", "__shfl_down_sync",
                           "lanes that exited", lanes}));
        CHECK(throws_with([] { es::syncwarp_against_syncthreads(); },
                          {"cuda emulation: kernel 'syncwarp_vs_syncthreads_kernel'", "deadlock",
                           "1 thread at __syncwarp", "31 threads at __syncthreads"}));
    }
}

TEST_CASE("an exception inside a kernel reaches the caller and the emulator keeps working") {
    const auto live = qk::emu::live_device_bytes();
    for (auto order : kOrders) {
        OrderGuard guard(order, 8);
        CHECK_THROWS_WITH_AS(es::throw_inside_kernel(), "thrown by thread 5", std::runtime_error);
        CHECK(es::atomic_count(3, 33) == 99);
    }
    CHECK(qk::emu::live_device_bytes() == live);
    CHECK(throws_with([] { es::launch_too_many_threads(); },
                      {"invalid launch configuration", "2048 threads"}));
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("planted bugs 5 and 6: wrong-direction copies, overruns and double frees") {
    const auto live = qk::emu::live_device_bytes();
    float *a = nullptr, *b = nullptr;
    REQUIRE(cudaMalloc(&a, 64 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, 64 * sizeof(float)) == cudaSuccess);
    CHECK(qk::emu::live_device_bytes() == live + 512);
    CHECK(qk::emu::is_device_pointer(a));
    std::vector<float> host(64, 2.0f), back(64, 0.0f);

    CHECK(cudaMemcpy(a, host.data(), 256, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(b, a, 256, cudaMemcpyDeviceToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(back.data(), b, 256, cudaMemcpyDefault) == cudaSuccess);
    CHECK(back == host);

    CHECK(cudaMemcpy(a, b, 256, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    auto msg = qk::emu::last_error_message();
    CHECK(msg.starts_with("cuda emulation: cudaMemcpy(cudaMemcpyHostToDevice, 256 bytes)"));
    CHECK(msg.find("the source is device memory") != std::string::npos);
    CHECK(msg.find("expected host memory") != std::string::npos);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);

    CHECK(cudaMemcpy(host.data(), back.data(), 256, cudaMemcpyDeviceToHost) ==
          cudaErrorInvalidValue);
    CHECK(qk::emu::last_error_message().find("the source is a host pointer") != std::string::npos);
    CHECK(cudaMemcpy(a, host.data(), 260, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(qk::emu::last_error_message().find("runs 4 bytes past the end of its device allocation "
                                             "of 256 bytes") != std::string::npos);
    CHECK(cudaMemset(a + 60, 0, 20) == cudaErrorInvalidValue);
    CHECK(cudaMemset(host.data(), 0, 20) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(a, host.data(), 4, static_cast<cudaMemcpyKind>(9)) ==
          cudaErrorInvalidMemcpyDirection);

    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaFree(a) == cudaErrorInvalidValue);
    CHECK(qk::emu::last_error_message().find("double free") != std::string::npos);
    CHECK(cudaFree(host.data()) == cudaErrorInvalidValue);
    CHECK(qk::emu::last_error_message().find("host pointer") != std::string::npos);
    CHECK(cudaFree(b + 1) == cudaErrorInvalidValue);
    CHECK(qk::emu::last_error_message().find("not the start of an allocation") !=
          std::string::npos);
    CHECK(cudaFree(b) == cudaSuccess);
    CHECK(cudaFree(nullptr) == cudaSuccess);
    CHECK(qk::emu::live_device_bytes() == live);
    (void)cudaGetLastError();
}

TEST_CASE("runtime API odds and ends: device, streams, zero-byte malloc") {
    int count = 0, dev = -1;
    CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
    CHECK(count == 1);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
    CHECK(cudaGetDevice(&dev) == cudaSuccess);
    CHECK(dev == 0);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(std::string(prop.name) == "qknorm CPU emulation");
    CHECK(prop.warpSize == 32);
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    void* p = &count;
    CHECK(cudaMalloc(&p, 0) == cudaSuccess);
    CHECK(p == nullptr);
    CHECK(std::string(cudaGetErrorString(cudaErrorInvalidValue)) == "invalid argument");
    (void)cudaGetLastError();
}

// ---- cuBLAS shim ------------------------------------------------------------------------------

namespace {

// C = alpha op(A) op(B) + beta C, column-major, the definition itself.
template <typename T>
void naive_gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T* A, int lda, const T* B,
                int ldb, T beta, T* C, int ldc) {
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double acc = 0;
            for (int p = 0; p < k; ++p) {
                const T a = ta ? A[p + i * lda] : A[i + p * lda];
                const T b = tb ? B[j + p * ldb] : B[p + j * ldb];
                acc += double(a) * double(b);
            }
            C[i + j * ldc] = static_cast<T>(alpha * acc + beta * double(C[i + j * ldc]));
        }
}

template <typename T>
std::vector<T> pattern(std::size_t n, int salt) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(((i * 37 + salt * 11) % 17) - 8) / 4;
    return v;
}

template <typename T>
T* to_device(const std::vector<T>& v) {
    T* p = nullptr;
    REQUIRE(cudaMalloc(&p, v.size() * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    return p;
}
template <typename T>
std::vector<T> from_device(const T* p, std::size_t n) {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
}

cublasStatus_t call_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const float* al, const float* A, int lda, long long sa,
                         const float* B, int ldb, long long sb, const float* be, float* C, int ldc,
                         long long sc, int batch, bool strided) {
    return strided ? cublasSgemmStridedBatched(h, ta, tb, m, n, k, al, A, lda, sa, B, ldb, sb, be,
                                               C, ldc, sc, batch)
                   : cublasSgemm(h, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}
cublasStatus_t call_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const double* al, const double* A, int lda, long long sa,
                         const double* B, int ldb, long long sb, const double* be, double* C,
                         int ldc, long long sc, int batch, bool strided) {
    return strided ? cublasDgemmStridedBatched(h, ta, tb, m, n, k, al, A, lda, sa, B, ldb, sb, be,
                                               C, ldc, sc, batch)
                   : cublasDgemm(h, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}

template <typename T>
void check_gemm_against_naive(bool strided) {
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const int m = 5, n = 7, k = 3, batch = strided ? 3 : 1;
    const T alpha = T(1.5), beta = T(-0.5);
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
            const long long sa = lda * (ta ? m : k) + 4, sb = ldb * (tb ? k : n) + 1,
                            sc = ldc * n + 2;
            auto A = pattern<T>(sa * batch, 1), B = pattern<T>(sb * batch, 2),
                 C = pattern<T>(sc * batch, 3);
            T *dA = to_device(A), *dB = to_device(B), *dC = to_device(C);
            const auto opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
            CHECK(call_gemm(h, opa, opb, m, n, k, &alpha, dA, lda, sa, dB, ldb, sb, &beta, dC, ldc,
                            sc, batch, strided) == CUBLAS_STATUS_SUCCESS);
            for (int b = 0; b < batch; ++b)
                naive_gemm(ta, tb, m, n, k, alpha, &A[b * sa], lda, &B[b * sb], ldb, beta,
                           &C[b * sc], ldc);
            const auto got = from_device(dC, C.size());
            double worst = 0;
            for (std::size_t i = 0; i < C.size(); ++i)
                worst = std::max(worst, std::abs(double(got[i]) - double(C[i])));
            INFO("ta " << ta << " tb " << tb << " strided " << strided);
            CHECK(worst < (sizeof(T) == 4 ? 1e-5 : 1e-12));
            cudaFree(dA), cudaFree(dB), cudaFree(dC);
        }
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
}

}  // namespace

TEST_CASE("cuBLAS shim: Sgemm / Dgemm / StridedBatched match a naive column-major GEMM") {
    check_gemm_against_naive<float>(false);
    check_gemm_against_naive<float>(true);
    check_gemm_against_naive<double>(false);
    check_gemm_against_naive<double>(true);
}

TEST_CASE("cuBLAS shim: argument rules give CUBLAS_STATUS_INVALID_VALUE") {
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const int m = 4, n = 3, k = 2;
    std::vector<float> A(64, 1.0f), B(64, 1.0f), C(64, 0.0f);
    float *dA = to_device(A), *dB = to_device(B), *dC = to_device(C);
    const float one = 1.0f, zero = 0.0f;
    auto sg = [&](cublasOperation_t ta, cublasOperation_t tb, int mm, int nn, int kk, int lda,
                  int ldb, int ldc) {
        return cublasSgemm(h, ta, tb, mm, nn, kk, &one, dA, lda, dB, ldb, &zero, dC, ldc);
    };
    const auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    CHECK(sg(N, N, m, n, k, m, k, m) == CUBLAS_STATUS_SUCCESS);
    CHECK(sg(N, N, -1, n, k, m, k, m) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(sg(N, N, m, -1, k, m, k, m) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(sg(N, N, m, n, -1, m, k, m) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(sg(N, N, m, n, k, m - 1, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // lda < m for OP_N
    CHECK(sg(T, N, m, n, k, k - 1, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // lda < k for OP_T
    CHECK(sg(T, N, m, n, k, k, k, m) == CUBLAS_STATUS_SUCCESS);
    CHECK(sg(N, N, m, n, k, m, k - 1, m) == CUBLAS_STATUS_INVALID_VALUE);  // ldb < k for OP_N
    CHECK(sg(N, T, m, n, k, m, n - 1, m) == CUBLAS_STATUS_INVALID_VALUE);  // ldb < n for OP_T
    CHECK(sg(N, N, m, n, k, m, k, m - 1) == CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
    CHECK(sg(N, N, 0, n, k, 0, k, 0) == CUBLAS_STATUS_INVALID_VALUE);      // lda < max(1, m)
    CHECK(sg(N, N, 0, n, k, 1, k, 1) == CUBLAS_STATUS_SUCCESS);            // empty is fine
    CHECK(sg(static_cast<cublasOperation_t>(7), N, m, n, k, m, k, m) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasSgemmStridedBatched(h, N, N, m, n, k, &one, dA, m, 0, dB, k, 0, &zero, dC, m, 0,
                                    -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasSgemm(h, N, N, m, n, k, nullptr, dA, m, dB, k, &zero, dC, m) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasSgemm(nullptr, N, N, m, n, k, &one, dA, m, dB, k, &zero, dC, m) ==
          CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(qk::emu::last_error_message().find("cublasSgemm") != std::string::npos);
    // k == 0: C = beta * C without reading A or B.
    CHECK(sg(N, N, m, n, 0, m, 1, m) == CUBLAS_STATUS_SUCCESS);
    // Host matrices and ranges past an allocation are reported.
    CHECK(
        throws_with([&] { cublasSgemm(h, N, N, m, n, k, &one, A.data(), m, dB, k, &zero, dC, m); },
                    {"cuda emulation: cublasSgemm: A is a host pointer"}));
    CHECK(throws_with([&] { sg(N, N, m, n, k, 70, k, m); },
                      {"cuda emulation: cublasSgemm: A spans", "past the end"}));
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE)) ==
          "CUBLAS_STATUS_INVALID_VALUE");
}

TEST_CASE("cuBLASLt shim: the bias epilogue, beta with a separate C, and the argument rules") {
    cublasLtHandle_t lt = nullptr;
    REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
    // D (m x n) = A (m x k) · B (k x n) + beta · C + bias, column-major, bf16 A and B.
    const int m = 3, n = 2, k = 2;
    const std::vector<qk::bf16> A{qk::bf16(1.0f), qk::bf16(2.0f), qk::bf16(3.0f),
                                  qk::bf16(4.0f), qk::bf16(5.0f), qk::bf16(6.0f)};
    const std::vector<qk::bf16> B{qk::bf16(1.0f), qk::bf16(-1.0f), qk::bf16(0.5f), qk::bf16(2.0f)};
    const std::vector<float> C{10, 20, 30, 40, 50, 60}, bias{0.25f, -0.5f, 1.0f};
    auto *dA = to_device(A), *dB = to_device(B);
    float *dC = to_device(C), *dD = to_device(std::vector<float>(6, 0.0f)),
          *d_bias = to_device(bias);
    cublasLtMatmulDesc_t op = nullptr;
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof epilogue) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    REQUIRE(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, m, k, m) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, n, m) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t pref = nullptr;
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t result{};
    int found = -1;
    // The bias epilogue needs its pointer.
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &result, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(found == 0);
    CHECK(qk::emu::last_error_message().find("BIAS_POINTER") != std::string::npos);
    CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d_bias, 4) ==
          CUBLAS_STATUS_INVALID_VALUE);  // the attribute's size is a pointer's
    REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d_bias,
                                           sizeof d_bias) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &result, &found) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(found == 1);
    const float one = 1.0f, half = 0.5f;
    REQUIRE(cublasLtMatmul(lt, op, &one, dA, a, dB, b, &half, dC, c, dD, c, &result.algo, nullptr,
                           0, nullptr) == CUBLAS_STATUS_SUCCESS);
    const auto got = from_device(dD, 6);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            float want = 0.5f * C[size_t(j * m + i)] + bias[size_t(i)];
            for (int p = 0; p < k; ++p)
                want += A[size_t(p * m + i)].to_float() * B[size_t(j * k + p)].to_float();
            CHECK(got[size_t(j * m + i)] == want);  // small integers and halves: exact
        }
    // Shapes that do not chain, a float32 A, a short ld, a destroyed handle; a host bias.
    cublasLtMatrixLayout_t wrong = nullptr, a32 = nullptr, short_ld = nullptr;
    REQUIRE(cublasLtMatrixLayoutCreate(&wrong, CUDA_R_16BF, k + 1, n, k + 1) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, wrong, c, c, pref, 1, &result, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(cublasLtMatrixLayoutCreate(&a32, CUDA_R_32F, m, k, m) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a32, b, c, c, pref, 1, &result, &found) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(found == 0);
    CHECK(cublasLtMatrixLayoutCreate(&short_ld, CUDA_R_16BF, m, k, m - 1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 0, &result, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);  // at least one result asked for
    const float* host_bias = bias.data();
    REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &host_bias,
                                           sizeof host_bias) == CUBLAS_STATUS_SUCCESS);
    CHECK(throws_with(
        [&] {
            cublasLtMatmul(lt, op, &one, dA, a, dB, b, &half, dC, c, dD, c, &result.algo, nullptr,
                           0, nullptr);
        },
        {"cuda emulation: cublasLtMatmul: the bias is a host pointer"}));
    for (auto layout : {a, b, c, wrong, a32}) cublasLtMatrixLayoutDestroy(layout);
    cublasLtMatmulDescDestroy(op);
    cublasLtMatmulPreferenceDestroy(pref);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD), cudaFree(d_bias);
    CHECK(cublasLtDestroy(lt) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                         1, &result, &found) == CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST_CASE("fiber cost (printed, never asserted)") {
    using clock = std::chrono::steady_clock;
    auto seconds = [](auto f) {
        f();  // warm-up: stacks mapped
        const auto t0 = clock::now();
        f();
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    const int blocks = 16, threads = 1024, barriers = 32;
    const double t0 = seconds([&] { es::cost_probe(blocks, threads, 0); });
    const double tb = seconds([&] { es::cost_probe(blocks, threads, barriers); });
    const double per_thread = t0 / (blocks * threads),
                 per_barrier = (tb - t0) / (blocks * threads * barriers);
    MESSAGE("emulated thread: " << per_thread * 1e9
                                << " ns; barrier per thread: " << per_barrier * 1e9 << " ns");
}
