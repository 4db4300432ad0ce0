// The cuBLAS shim of the CUDA emulation: cuBLAS's argument rules in front of column-major
// cblas_sgemm / cblas_dgemm. See cublas_emu.h for the rules.
#include "cuda/emu/cublas_emu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bfloat16.h"
#include "core/error.h"
#include "core/float16.h"
#include "cuda/emu/emu_internal.h"
#include "cuda/ledger.h"

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace qk::emu {
namespace {

using Handles = detail::LiveHandles<cublasContext>;
bool live(cublasHandle_t h) { return Handles::get().live(h); }

bool valid_op(cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}
CBLAS_TRANSPOSE to_cblas(cublasOperation_t op) {
    return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

void gemm(const float* a, const float* b, float* c, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m,
          int n, int k, float alpha, int lda, int ldb, float beta, int ldc) {
    cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(const double* a, const double* b, double* c, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
          int m, int n, int k, double alpha, int lda, int ldb, double beta, int ldc) {
    cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The half-input GEMM (bf16 or f16 A and B, float32 C): each element's sum runs over k in order,
// one float32 FMA a step (a product of two halves is exact in float32), whatever m, n and k are.
// cblas_sgemm on the widened operands would block the sums by the call's shape; this way a
// product cut into sub-blocks (the materialised attention's block-triangular GEMMs) sums every
// element as the whole product does, and tests compare the two bit for bit. Column-major, as
// cuBLAS: op(A) is widened to a contiguous (m, k), and each column of C is m sums that run side
// by side (they vectorise), each in its own k order.
template <class Half>
void gemm(const Half* a, const Half* b, float* c, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m,
          int n, int k, float alpha, int lda, int ldb, float beta, int ldc) {
    const auto rows = static_cast<size_t>(m);
    std::vector<float> op_a(rows * static_cast<size_t>(k)), sums;
    for (int kk = 0; kk < k; ++kk)
        for (int i = 0; i < m; ++i)
            op_a[static_cast<size_t>(kk) * rows + i] =
                (ta == CblasNoTrans ? a[static_cast<long long>(kk) * lda + i]
                                    : a[static_cast<long long>(i) * lda + kk])
                    .to_float();
    // Four columns of C at a time, so that each column of op(A) is read once for the four.
    constexpr int kColumns = 4;
    sums.resize(rows * kColumns);
    for (int j0 = 0; j0 < n; j0 += kColumns) {
        const int width = std::min(kColumns, n - j0);
        std::fill(sums.begin(), sums.end(), 0.0f);
        for (int kk = 0; kk < k; ++kk) {
            const float* a_col = op_a.data() + static_cast<size_t>(kk) * rows;
            for (int jj = 0; jj < width; ++jj) {
                const int j = j0 + jj;
                const float b_kj = (tb == CblasNoTrans ? b[static_cast<long long>(j) * ldb + kk]
                                                       : b[static_cast<long long>(kk) * ldb + j])
                                       .to_float();
                float* column_sums = sums.data() + static_cast<size_t>(jj) * rows;
                for (size_t i = 0; i < rows; ++i)
                    column_sums[i] = std::fma(a_col[i], b_kj, column_sums[i]);
            }
        }
        for (int jj = 0; jj < width; ++jj) {
            const float* column_sums = sums.data() + static_cast<size_t>(jj) * rows;
            float* c_col = c + static_cast<long long>(j0 + jj) * ldc;
            for (size_t i = 0; i < rows; ++i)  // beta = 0 reads no C (NaNs there do not survive)
                c_col[i] = beta == 0.0f ? alpha * column_sums[i]
                                        : alpha * column_sums[i] + beta * c_col[i];
        }
    }
}

// TF32: float32 with 10 mantissa bits, rounded to nearest even on the bits (NaN and Inf kept).
float round_to_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
    u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

// A float GEMM under TF32 math: A and B rounded to TF32 first (column-major, leading dims kept).
void gemm_tf32(const float* a, const float* b, float* c, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
               int m, int n, int k, float alpha, int lda, int ldb, float beta, int ldc) {
    const int rows_a = ta == CblasNoTrans ? m : k, cols_a = ta == CblasNoTrans ? k : m;
    const int rows_b = tb == CblasNoTrans ? k : n, cols_b = tb == CblasNoTrans ? n : k;
    // Every element up to the last one read (the last column is only `rows` long).
    std::vector<float> ra(a, a + static_cast<size_t>(lda) * (cols_a - 1) + rows_a);
    std::vector<float> rb(b, b + static_cast<size_t>(ldb) * (cols_b - 1) + rows_b);
    for (float& v : ra) v = round_to_tf32(v);
    for (float& v : rb) v = round_to_tf32(v);
    gemm(ra.data(), rb.data(), c, ta, tb, m, n, k, alpha, lda, ldb, beta, ldc);
}

// Requires the `count` matrices of a strided batch, each `extent` elements from its start, to lie
// in one device allocation.
template <typename T>
void require_batch(const char* api, const char* what, const T* p, long long extent,
                   long long stride, int count) {
    if (extent <= 0 || count <= 0) return;
    const long long span = static_cast<long long>(count - 1) * stride;
    const T* lo = p + std::min(0ll, span);
    const long long elements = std::abs(span) + extent;
    detail::require_device_range(api, what, lo, static_cast<std::size_t>(elements) * sizeof(T));
}

// cuBLAS's argument rules; "" when the arguments are valid, else what is wrong.
std::string bad_arguments(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                          const void* alpha, int lda, int ldb, const void* beta, int ldc,
                          int batch) {
    const int rows_a = transa == CUBLAS_OP_N ? m : k, rows_b = transb == CUBLAS_OP_N ? k : n;
    if (!valid_op(transa) || !valid_op(transb))
        return fmt::format("transa {} / transb {} is not CUBLAS_OP_N, _T or _C", int(transa),
                           int(transb));
    if (m < 0 || n < 0 || k < 0)
        return fmt::format("m {}, n {}, k {} must not be negative", m, n, k);
    if (lda < std::max(1, rows_a))
        return fmt::format("lda {} < max(1, {}) (rows of A as stored)", lda, rows_a);
    if (ldb < std::max(1, rows_b))
        return fmt::format("ldb {} < max(1, {}) (rows of B as stored)", ldb, rows_b);
    if (ldc < std::max(1, m)) return fmt::format("ldc {} < max(1, m = {})", ldc, m);
    if (batch < 0) return fmt::format("batchCount {} is negative", batch);
    if (!alpha || !beta) return "alpha and beta must not be null";
    return "";
}

// In: the element type of A and B (T, or bf16 with T = float); T: C's, alpha's and beta's.
template <typename In, typename T>
cublasStatus_t gemm_batched(const char* api, cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const T* alpha,
                            const In* A, int lda, long long sa, const In* B, int ldb, long long sb,
                            const T* beta, T* C, int ldc, long long sc, int batch) {
    if (!live(handle)) {
        detail::record_message(fmt::format("{}: the handle is null or destroyed", api));
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    const int rows_a = transa == CUBLAS_OP_N ? m : k, cols_a = transa == CUBLAS_OP_N ? k : m;
    const int rows_b = transb == CUBLAS_OP_N ? k : n, cols_b = transb == CUBLAS_OP_N ? n : k;
    const std::string bad =
        bad_arguments(transa, transb, m, n, k, alpha, lda, ldb, beta, ldc, batch);
    if (!bad.empty()) {
        detail::record_message(fmt::format("{}: {}", api, bad));
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    QK_CHECK(detail::classify(alpha).where == detail::Where::host &&
                 detail::classify(beta).where == detail::Where::host,
             "cuda emulation: {}: alpha and beta must be host pointers (pointer mode host)", api);
    const bool reads_ab = k > 0;
    if (reads_ab) {
        require_batch(api, "A", A, static_cast<long long>(lda) * (cols_a - 1) + rows_a, sa, batch);
        require_batch(api, "B", B, static_cast<long long>(ldb) * (cols_b - 1) + rows_b, sb, batch);
    }
    require_batch(api, "C", C, static_cast<long long>(ldc) * (n - 1) + m, sc, batch);
    if (qk::cuda::ledger::dry_run()) return CUBLAS_STATUS_SUCCESS;  // checked, not computed
    const T a = *alpha, b = *beta;
    for (int i = 0; i < batch; ++i) {
        T* c = C + i * sc;
        if (!reads_ab || a == T(0)) {
            // C = beta * C; beta == 0 writes zeros without reading C (NaNs there do not survive).
            for (int j = 0; j < n; ++j)
                for (int r = 0; r < m; ++r) {
                    T& v = c[static_cast<long long>(j) * ldc + r];
                    v = b == T(0) ? T(0) : b * v;
                }
            continue;
        }
        if constexpr (std::is_same_v<In, float>)
            if (handle->math == CUBLAS_TF32_TENSOR_OP_MATH) {
                gemm_tf32(A + i * sa, B + i * sb, c, to_cblas(transa), to_cblas(transb), m, n, k, a,
                          lda, ldb, b, ldc);
                continue;
            }
        gemm(A + i * sa, B + i * sb, c, to_cblas(transa), to_cblas(transb), m, n, k, a, lda, ldb, b,
             ldc);
    }
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace qk::emu

const char* cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "an invalid numeric value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "the functionality requested is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "an error was detected when checking the current licensing";
    }
    return "unknown error";
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = qk::emu::Handles::get().create();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    return qk::emu::Handles::get().destroy(handle) ? CUBLAS_STATUS_SUCCESS
                                                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!qk::emu::live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
    if (!qk::emu::live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!qk::emu::live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    if (!qk::emu::live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
    return qk::emu::gemm_batched("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0,
                                 B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double* alpha,
                           const double* A, int lda, const double* B, int ldb, const double* beta,
                           double* C, int ldc) {
    return qk::emu::gemm_batched("cublasDgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0,
                                 B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb,
                                         long long strideB, const float* beta, float* C, int ldc,
                                         long long strideC, int batchCount) {
    return qk::emu::gemm_batched("cublasSgemmStridedBatched", handle, transa, transb, m, n, k,
                                 alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                                 batchCount);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double* alpha, const double* A, int lda,
                                         long long strideA, const double* B, int ldb,
                                         long long strideB, const double* beta, double* C, int ldc,
                                         long long strideC, int batchCount) {
    return qk::emu::gemm_batched("cublasDgemmStridedBatched", handle, transa, transb, m, n, k,
                                 alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                                 batchCount);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA, const void* B,
    cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C, cudaDataType Ctype,
    int ldc, long long strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t) {
    const bool half_inputs = Atype == Btype && (Atype == CUDA_R_16BF || Atype == CUDA_R_16F);
    if (!half_inputs || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F) {
        qk::emu::detail::record_message(fmt::format(
            "cublasGemmStridedBatchedEx: the emulation takes A, B both CUDA_R_16BF or both "
            "CUDA_R_16F, C CUDA_R_32F and CUBLAS_COMPUTE_32F; got types {}, {}, {} and compute {}",
            int(Atype), int(Btype), int(Ctype), int(computeType)));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    auto run = [&](auto half_tag) {
        using Half = decltype(half_tag);
        return qk::emu::gemm_batched("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k,
                                     static_cast<const float*>(alpha), static_cast<const Half*>(A),
                                     lda, strideA, static_cast<const Half*>(B), ldb, strideB,
                                     static_cast<const float*>(beta), static_cast<float*>(C), ldc,
                                     strideC, batchCount);
    };
    return Atype == CUDA_R_16BF ? run(qk::bf16{}) : run(qk::f16{});
}
