// The cuBLAS subset of the CUDA emulation (include it through cuda/emu/cublas_compat.h): handles,
// streams, and single/double GEMM, plain and strided-batched, on column-major cblas; and the
// mixed-precision cublasGemmStridedBatchedEx for bf16 inputs with a float32 result.
//
// Argument rules are cuBLAS's: a null or destroyed handle gives CUBLAS_STATUS_NOT_INITIALIZED;
// m, n, k < 0, an unknown operation, lda < max(1, rows of op(A) as stored), ldb likewise,
// ldc < max(1, m), batchCount < 0 or a null alpha/beta give CUBLAS_STATUS_INVALID_VALUE and
// compute nothing. alpha and beta are host pointers (pointer mode host). A, B and C must be
// device memory covering every element the call touches; otherwise the shim throws qk::Error
// ("cuda emulation: cublasSgemm: ..."), since real cuBLAS would fault asynchronously.
#pragma once

#include "cuda/emu/cuda_emu.h"

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
};

enum cublasOperation_t {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2,  // the same as CUBLAS_OP_T for real types
};

struct cublasContext;
using cublasHandle_t = cublasContext*;

const char* cublasGetStatusString(cublasStatus_t status);
const char* cublasGetStatusName(cublasStatus_t status);
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
// The math mode: with CUBLAS_TF32_TENSOR_OP_MATH, the shim's float GEMMs round A and B to TF32
// (10 mantissa bits, to nearest even) before multiplying, as tensor cores read them; the sums
// stay float32. (The hardware's rounding of the inputs may differ in ties: the precision is what
// the shim reproduces.)
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);

// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, all column-major.
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double* alpha,
                           const double* A, int lda, const double* B, int ldb, const double* beta,
                           double* C, int ldc);
// The same for batchCount matrices spaced strideA/strideB/strideC elements apart.
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb,
                                         long long strideB, const float* beta, float* C, int ldc,
                                         long long strideC, int batchCount);
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double* alpha, const double* A, int lda,
                                         long long strideA, const double* B, int ldb,
                                         long long strideB, const double* beta, double* C, int ldc,
                                         long long strideC, int batchCount);

// The mixed-precision GEMM: the types are named at run time. The shim takes what the library
// uses, A and B CUDA_R_16BF, C CUDA_R_32F, computeType CUBLAS_COMPUTE_32F (bf16 products summed
// in float32, as tensor cores do), and answers CUBLAS_STATUS_NOT_SUPPORTED to anything else.
// alpha and beta point to floats. (Enum values are cuBLAS's own.)
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);
