// The cuBLASLt subset of the CUDA emulation (include it through cuda/emu/cublaslt_compat.h): one
// GEMM, D = alpha · op(A) · op(B) + beta · C, with cuBLASLt's bias epilogue (D += bias, a value per
// row of D, before D is stored), on column-major cblas like the cuBLAS shim (cublas_emu.h).
//
// What the library uses, and nothing else: computeType CUBLAS_COMPUTE_32F with scaleType
// CUDA_R_32F; A and B both CUDA_R_16BF or both CUDA_R_16F, C and D CUDA_R_32F, column-major, no
// batch; epilogue CUBLASLT_EPILOGUE_DEFAULT or CUBLASLT_EPILOGUE_BIAS with a CUDA_R_32F bias (the
// default type for a float32 D). Anything else is CUBLAS_STATUS_NOT_SUPPORTED, with the reason kept
// for the error message as the cuBLAS shim does.
//
// Argument rules are cuBLASLt's: a null or destroyed handle gives CUBLAS_STATUS_NOT_INITIALIZED; a
// layout with ld < rows, an attribute of the wrong size, shapes that do not chain (op(A) m × k,
// op(B) k × n, C and D m × n), a bias epilogue without a bias pointer, or a heuristic asked for
// fewer than one result give CUBLAS_STATUS_INVALID_VALUE. The heuristic offers one algorithm
// (no workspace) when the operation is one the shim computes, and none otherwise. alpha and beta
// are host pointers (the default pointer mode); A, B, C (when beta ≠ 0), D and the bias must be
// device memory covering every element the call touches, else qk::Error as from the cuBLAS shim.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/emu/cublas_emu.h"

struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;
struct cublasLtMatmulDescOpaque_t;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
struct cublasLtMatrixLayoutOpaque_t;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
struct cublasLtMatmulPreferenceOpaque_t;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

// Enum values are cuBLASLt's own.
enum cublasLtMatmulDescAttributes_t {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,          // int32_t (cublasOperation_t)
    CUBLASLT_MATMUL_DESC_TRANSB = 4,          // int32_t (cublasOperation_t)
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,        // uint32_t (cublasLtEpilogue_t)
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,    // const void*
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26  // int32_t (cudaDataType_t), -1: D's type
};
enum cublasLtEpilogue_t { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 };
enum cublasLtMatmulPreferenceAttributes_t {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,  // uint64_t
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8  // uint32_t each
};

struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    std::size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t sizeInBytes);

// A column-major rows × cols matrix of `type` with leading dimension ld.
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t sizeInBytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, std::size_t workspaceSizeInBytes,
                              cudaStream_t stream);
