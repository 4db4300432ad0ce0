// cuda/matmul.cu — matrix multiplication on the device: cuBLAS for the real work, and a
// hand-written tiled shared-memory kernel kept as the teaching version.
// Built as CUDA by nvcc, or as C++ against cuda/emu in the emulation build (where cuBLAS is the
// project's shim on column-major cblas, cuda/emu/cublas_emu.h).
//
// v2, gemm(): cublas{S,D}gemmStridedBatched. cuBLAS is column-major and our tensors are
// row-major, and the trick costs nothing: a row-major (M, N) matrix with leading dim ld is, byte
// for byte, the column-major (N, M) matrix with the same ld, i.e. its transpose. So the row-major
//     C = op(A) · op(B)          is the column-major     Cᵀ = op(B)ᵀ · op(A)ᵀ,
// which is what we ask cuBLAS for: B passed first, A second, m = N, n = M, and each operand's own
// flag unchanged. An operand stored transposed (W.t() in x · W.t(), strides (1, ld)) is, read
// column-major, the plain matrix, and gets CUBLAS_OP_T exactly as the CPU path passes CblasTrans,
// with the same leading dim (ops/matmul_layout.cpp's gemm_layout decides both). The batch is one
// stride per operand (0 for an operand broadcast over the batch); ops/matmul.cpp walks any further
// batch dims on the host, one strided-batched call per run of the innermost batch dim.
//
// v1, matmul_tiled(): the classic shared-memory tiling, for reading and for testing the layout
// logic above against. Work split: one 16×16 thread block per 16×16 tile of C, one thread per
// element of C, blockIdx.z the batch index. Each step loads a 16×16 tile of A and of B into shared
// memory (one element per thread, zero-padded past the ragged edges), syncs, and every thread
// adds the 16 products of its row of the A tile and column of the B tile. Each global element is
// loaded once per tile instead of once per product: 16× less global traffic than the naive loop,
// which is why it beats the one-thread-per-element kernel; cuBLAS is faster still (register
// tiling, tensor cores, double buffering), hence v2. Within a warp (two rows of the tile) reads of
// a_tile[ty][k] are broadcasts and reads of b_tile[k][tx] are consecutive: no bank conflicts.
//
// CPU twins: cpu::gemm and cpu::batched_gemm in ops/gemm.cpp (cblas_sgemm/dgemm, CblasRowMajor).
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "core/storage.h"
#include "cuda/emu/cublaslt_compat.h"
#include "cuda/runtime.h"
#include "ops/matmul.h"

namespace qk::cuda {

template <class T>
void gemm(T* y, int64_t ldy, int64_t stride_y, const T* a, bool a_trans, int64_t lda,
          int64_t stride_a, const T* b, bool b_trans, int64_t ldb, int64_t stride_b, int64_t M,
          int64_t N, int64_t K, int64_t batch, T beta) {
    if (M == 0 || N == 0 || batch == 0) return;
    QK_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && batch <= INT_MAX && ldy <= INT_MAX &&
                 lda <= INT_MAX && ldb <= INT_MAX,
             "matmul: ({}, {}) x ({}, {}) over {} batches exceeds cuBLAS's int range", M, K, K, N,
             batch);
    const T alpha = 1;
    // Row-major C = op(A)·op(B) as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B first, m = N, n = M.
    const cublasOperation_t op_b = b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    // Ledger: 2MNK FLOPs a batch, on CUDA cores (TF32 tensor cores when set_tf32_math is on: the
    // ledger does not know, and counts them as float32); A, B read and C written once.
    const double products = double(M) * double(N) * double(K) * double(batch);
    ledger::declare(double(sizeof(T)) * double(batch) * double(M * K + K * N + M * N), 2 * products,
                    0, std::is_same_v<T, double>);
    const ledger::Scope scope(ledger::is_open() ? fmt::format("{}gemmStridedBatched {}x{}x{} x{}",
                                                              std::is_same_v<T, float> ? "S" : "D",
                                                              M, N, K, batch)
                                                : std::string());
    if constexpr (std::is_same_v<T, float>)
        QK_CUDA_CHECK(
            cublasSgemmStridedBatched(blas(), op_b, op_a, m, n, k, &alpha, b, static_cast<int>(ldb),
                                      stride_b, a, static_cast<int>(lda), stride_a, &beta, y,
                                      static_cast<int>(ldy), stride_y, static_cast<int>(batch)));
    else
        QK_CUDA_CHECK(
            cublasDgemmStridedBatched(blas(), op_b, op_a, m, n, k, &alpha, b, static_cast<int>(ldb),
                                      stride_b, a, static_cast<int>(lda), stride_a, &beta, y,
                                      static_cast<int>(ldy), stride_y, static_cast<int>(batch)));
}

void set_tf32_math(bool on) {
    QK_CUDA_CHECK(cublasSetMathMode(blas(), on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

// The mixed-precision twins: bf16 or f16 operands, float32 result, products summed in float32 on
// the tensor cores (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F). Same layout trick and batch
// strides as above; alpha scales the float32 sums (attention's 1/sqrt(D) on q·kᵀ).
template <class Half>
void gemm_mixed(float* y, int64_t ldy, int64_t stride_y, const Half* a, bool a_trans, int64_t lda,
                int64_t stride_a, const Half* b, bool b_trans, int64_t ldb, int64_t stride_b,
                int64_t M, int64_t N, int64_t K, int64_t batch, float alpha, float beta) {
    if (M == 0 || N == 0 || batch == 0) return;
    constexpr bool is_bf16 = std::is_same_v<Half, bf16>;
    QK_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && batch <= INT_MAX && ldy <= INT_MAX &&
                 lda <= INT_MAX && ldb <= INT_MAX,
             "matmul: ({}, {}) x ({}, {}) over {} batches in {} exceeds cuBLAS's int range", M, K,
             K, N, batch, is_bf16 ? "bf16" : "fp16");
    const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t op_b = b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    // Ledger: 2MNK FLOPs a batch on tensor cores; 2-byte A and B read, float32 C written.
    const double matrices = double(batch);
    ledger::declare(matrices * (2.0 * double(M * K + K * N) + 4.0 * double(M * N)), 0,
                    2.0 * matrices * double(M) * double(N) * double(K));
    // Whether cuBLAS can take its aligned tensor-core kernels (the cost model reads the word): N
    // and K multiples of 8, every matrix and row 16-byte aligned. An odd M with aligned rows ran
    // at full speed on an H200 (the vocabulary head's dW); an odd N or K did not, whatever the
    // rows.
    const auto on_16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    const bool aligned =
        N % 8 == 0 && K % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && ldy % 4 == 0 && on_16(a) &&
        on_16(b) && on_16(y) &&
        (batch == 1 || (stride_a % 8 == 0 && stride_b % 8 == 0 && stride_y % 4 == 0));
    const ledger::Scope scope(
        ledger::is_open() ? fmt::format("GemmEx {} {}x{}x{}{} {}", is_bf16 ? "bf16" : "fp16", M, N,
                                        K, batch > 1 ? fmt::format(" x{}", batch) : std::string(),
                                        aligned ? "aligned" : "unaligned")
                          : std::string());
    QK_CUDA_CHECK(cublasGemmStridedBatchedEx(
        blas(), op_b, op_a, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
        b, type, static_cast<int>(ldb), stride_b, a, type, static_cast<int>(lda), stride_a, &beta,
        y, CUDA_R_32F, static_cast<int>(ldy), stride_y, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
}

// ---- the bias in the GEMM's epilogue (cuBLASLt) --------------------------------------------
//
// The Linear's y = x̃ · W̃ᵀ + b as one call: cuBLASLt's CUBLASLT_EPILOGUE_BIAS adds b to each row's
// float32 sums before y is stored, where cublasGemmEx has no bias and needed y filled with b first
// and read back (beta = 1): a write and a read of y saved, and the fill's launch. The same one
// float32 addition per value. Column-major, as above: D (N × R) = W̃ᵀ · x̃ with W̃ read as the
// stored (K × N) and x̃ as (K × R), so the bias is one value per row of D, which is what the
// epilogue broadcasts.
//
// A plan per shape and alignment (descriptors and the heuristic's algorithm) is made once and
// kept; the bias pointer is set at each call. No algorithm for a shape: the caller's two-step path.

namespace {

// The largest power of two dividing p's address, at most 256: what the heuristic is told, so that
// it never picks a kernel that needs more alignment than a pointer has.
uint32_t alignment_of(const void* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    uint32_t a = 256;
    while (a > 1 && address % a != 0) a /= 2;
    return a;
}

struct BiasGemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace = 0;
    bool found = false;
};

cublasLtHandle_t blas_lt() {
    static cublasLtHandle_t handle = [] {
        cublasLtHandle_t h = nullptr;
        QK_CUDA_CHECK(cublasLtCreate(&h));
        return h;
    }();
    return handle;
}

bool bias_epilogue_on = true;

// The plan for y (R, N) = x̃ (R, K) · W̃ᵀ (W̃: (N, K)) + b, all contiguous, at these alignments.
BiasGemmPlan make_plan(cudaDataType_t type, int64_t R, int64_t N, int64_t K, const float* bias,
                       const uint32_t (&alignments)[4]) {
    BiasGemmPlan plan;
    QK_CUDA_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    QK_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                 sizeof transpose));
    QK_CUDA_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    QK_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                 &epilogue, sizeof epilogue));
    QK_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &bias_type, sizeof bias_type));
    // The heuristic reads the bias's alignment from its pointer (a key of the plan's, with the
    // others' alignments).
    QK_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &bias, sizeof bias));
    QK_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan.w, type, uint64_t(K), uint64_t(N), K));
    QK_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan.x, type, uint64_t(K), uint64_t(R), K));
    QK_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan.y, CUDA_R_32F, uint64_t(N), uint64_t(R), N));
    cublasLtMatmulPreference_t preference = nullptr;
    QK_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t max_workspace = uint64_t{32} << 20;  // what Hopper's fastest kernels ask for
    QK_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference,
                                                       CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &max_workspace, sizeof max_workspace));
    // A = W̃, B = x̃, C = D = y.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> min_alignments[4] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignments[0]},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignments[1]},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignments[2]},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignments[2]}};
    for (const auto& [attribute, bytes] : min_alignments)
        QK_CUDA_CHECK(
            cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        blas_lt(), plan.desc, plan.w, plan.x, plan.y, plan.y, preference, 1, &result, &found);
    QK_CUDA_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) QK_CUDA_CHECK(status);
    plan.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
    plan.algo = result.algo;
    plan.workspace = result.workspaceSize;
    return plan;
}

}  // namespace

bool use_bias_epilogue(bool on) {
    const bool was = bias_epilogue_on;
    bias_epilogue_on = on;
    return was;
}

template <class Half>
bool linear_bias_mixed(float* y, const Half* x, const Half* w, const float* bias, int64_t R,
                       int64_t N, int64_t K) {
    constexpr bool is_bf16 = std::is_same_v<Half, bf16>;
    if (!bias_epilogue_on || R == 0 || N == 0 || K == 0 || R > INT_MAX || N > INT_MAX ||
        K > INT_MAX)
        return false;
    const uint32_t alignments[4] = {alignment_of(w), alignment_of(x), alignment_of(y),
                                    alignment_of(bias)};
    using Key = std::tuple<bool, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, uint32_t>;
    static std::mutex mutex;
    // Kept for the process's life, as cuBLAS's handle is: never destroyed, so the descriptors stay
    // reachable (a static map would drop them at exit unreleased, a leak to LeakSanitizer).
    static auto& plans = *new std::map<Key, BiasGemmPlan>;
    std::lock_guard lock(mutex);
    const Key key{is_bf16, R, N, K, alignments[0], alignments[1], alignments[2], alignments[3]};
    auto it = plans.find(key);
    if (it == plans.end())
        it = plans
                 .emplace(key,
                          make_plan(is_bf16 ? CUDA_R_16BF : CUDA_R_16F, R, N, K, bias, alignments))
                 .first;
    const BiasGemmPlan& plan = it->second;
    if (!plan.found) return false;
    QK_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &bias, sizeof bias));
    // Ledger: as gemm_mixed, plus the bias read; y written once, never read.
    ledger::declare(2.0 * double(R * K + N * K) + 4.0 * double(R * N + N), 0,
                    2.0 * double(R) * double(N) * double(K));
    const bool aligned = N % 8 == 0 && K % 8 == 0 && alignments[0] >= 16 && alignments[1] >= 16 &&
                         alignments[2] >= 16;
    const ledger::Scope scope(ledger::is_open() ? fmt::format("LtMatmul {} {}x{}x{} bias {}",
                                                              is_bf16 ? "bf16" : "fp16", R, N, K,
                                                              aligned ? "aligned" : "unaligned")
                                                : std::string());
    // Scratch from the caching allocator, freed at return: the stream orders its reuse.
    std::optional<Storage> workspace;
    if (plan.workspace) workspace.emplace(plan.workspace, Device::cuda);
    const float one = 1.0f, zero = 0.0f;
    QK_CUDA_CHECK(cublasLtMatmul(blas_lt(), plan.desc, &one, w, plan.w, x, plan.x, &zero, y, plan.y,
                                 y, plan.y, &plan.algo, workspace ? workspace->data() : nullptr,
                                 plan.workspace, stream()));
    return true;
}

template bool linear_bias_mixed<bf16>(float*, const bf16*, const bf16*, const float*, int64_t,
                                      int64_t, int64_t);
template bool linear_bias_mixed<f16>(float*, const f16*, const f16*, const float*, int64_t, int64_t,
                                     int64_t);

template void gemm_mixed<bf16>(float*, int64_t, int64_t, const bf16*, bool, int64_t, int64_t,
                               const bf16*, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                               int64_t, float, float);
template void gemm_mixed<f16>(float*, int64_t, int64_t, const f16*, bool, int64_t, int64_t,
                              const f16*, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                              int64_t, float, float);

namespace {

constexpr int kTile = 16;

// y: (batch, M, N), a: (batch, M, K), b: (batch, K, N), all contiguous row-major.
// grid (ceil(N/16), ceil(M/16), batch), block (16, 16).    y = a · b
template <class T>
__global__ void matmul_tiled_kernel(T* y, const T* a, const T* b, int M, int N, int K) {
    __shared__ T a_tile[kTile][kTile];
    __shared__ T b_tile[kTile][kTile];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t z = blockIdx.z;
    a += z * M * K;
    b += z * K * N;
    y += z * M * N;
    const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
    T acc = 0;
    for (int k0 = 0; k0 < K; k0 += kTile) {
        // Zero padding past the edges: the padded products add 0, so no bounds test in the loop.
        a_tile[ty][tx] = row < M && k0 + tx < K ? a[int64_t(row) * K + k0 + tx] : T(0);
        b_tile[ty][tx] = k0 + ty < K && col < N ? b[int64_t(k0 + ty) * N + col] : T(0);
        __syncthreads();  // the tiles are complete before anyone reads them
        for (int k = 0; k < kTile; ++k) acc += a_tile[ty][k] * b_tile[k][tx];
        __syncthreads();  // everyone is done reading before the next step overwrites them
    }
    if (row < M && col < N) y[int64_t(row) * N + col] = acc;
}

}  // namespace

template <class T>
void matmul_tiled(T* y, const T* a, const T* b, int64_t batch, int64_t M, int64_t N, int64_t K) {
    if (batch == 0 || M == 0 || N == 0) return;
    QK_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && batch <= 65535,
             "matmul_tiled: ({}, {}) x ({}, {}) over {} batches is too large for one grid", M, K, K,
             N, batch);
    const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile),
                    static_cast<unsigned>((M + kTile - 1) / kTile), static_cast<unsigned>(batch));
    ledger::declare_elements<T>(
        batch * (M * K * ((N + kTile - 1) / kTile) + K * N * ((M + kTile - 1) / kTile)),
        batch * M * N, 2.0 * double(batch * M * N * K));
    QK_LAUNCH((matmul_tiled_kernel<T>), grid, dim3(kTile, kTile), 0, stream(), y, a, b,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K));
    QK_CUDA_CHECK_LAUNCH("matmul_tiled_kernel");
}

template void gemm<float>(float*, int64_t, int64_t, const float*, bool, int64_t, int64_t,
                          const float*, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          float);
template void gemm<double>(double*, int64_t, int64_t, const double*, bool, int64_t, int64_t,
                           const double*, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, double);
template void matmul_tiled<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                  int64_t);
template void matmul_tiled<double>(double*, const double*, const double*, int64_t, int64_t, int64_t,
                                   int64_t);

}  // namespace qk::cuda
