// The cuBLASLt shim of the CUDA emulation: cuBLASLt's descriptors and argument rules in front of
// the cuBLAS shim's mixed-precision GEMM, then the bias epilogue. See cublaslt_emu.h for the rules.
#include "cuda/emu/cublaslt_emu.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "cuda/emu/emu_internal.h"
#include "cuda/ledger.h"

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
    cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    int32_t bias_type = -1;
};
struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t max_workspace = 0;
};

namespace qk::emu {
namespace {

using LtHandles = detail::LiveHandles<cublasLtContext>;
bool live(cublasLtHandle_t h) { return LtHandles::get().live(h); }

// The cuBLAS handle the shim's GEMM runs on (the emulator has one stream).
cublasHandle_t gemm_handle() {
    static cublasHandle_t handle = [] {
        cublasHandle_t h = nullptr;
        cublasCreate(&h);
        return h;
    }();
    return handle;
}

template <class T>
cublasStatus_t read_attribute(T& into, const void* buf, std::size_t size) {
    if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&into, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t refuse(cublasStatus_t status, std::string why) {
    detail::record_message(std::move(why));
    return status;
}

bool half_type(cudaDataType t) { return t == CUDA_R_16BF || t == CUDA_R_16F; }

// "" when the shim computes this operation, else why not (CUBLAS_STATUS_NOT_SUPPORTED).
std::string unsupported(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& a,
                        const cublasLtMatrixLayoutOpaque_t& b,
                        const cublasLtMatrixLayoutOpaque_t& c,
                        const cublasLtMatrixLayoutOpaque_t& d) {
    if (!half_type(a.type) || b.type != a.type || c.type != CUDA_R_32F || d.type != CUDA_R_32F)
        return fmt::format(
            "the emulation takes A, B both CUDA_R_16BF or both CUDA_R_16F and C, D CUDA_R_32F; got "
            "types {}, {}, {}, {}",
            int(a.type), int(b.type), int(c.type), int(d.type));
    if (op.epilogue == CUBLASLT_EPILOGUE_BIAS && op.bias_type != -1 && op.bias_type != CUDA_R_32F)
        return fmt::format("the emulation's bias is CUDA_R_32F, got type {}", op.bias_type);
    return "";
}

// cuBLASLt's shape rules: "" when op(A) (m × k), op(B) (k × n), C and D (m × n) chain.
std::string bad_shapes(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& a,
                       const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                       const cublasLtMatrixLayoutOpaque_t& d) {
    const uint64_t m = op.transa == CUBLAS_OP_N ? a.rows : a.cols;
    const uint64_t k = op.transa == CUBLAS_OP_N ? a.cols : a.rows;
    const uint64_t kb = op.transb == CUBLAS_OP_N ? b.rows : b.cols;
    const uint64_t n = op.transb == CUBLAS_OP_N ? b.cols : b.rows;
    if (k != kb || c.rows != m || c.cols != n || d.rows != m || d.cols != n)
        return fmt::format(
            "op(A) {} x {}, op(B) {} x {}, C {} x {} and D {} x {} do not chain as (m x k) (k x n) "
            "(m x n)",
            m, k, kb, n, c.rows, c.cols, d.rows, d.cols);
    if (op.epilogue == CUBLASLT_EPILOGUE_BIAS && !op.bias)
        return "the bias epilogue needs CUBLASLT_MATMUL_DESC_BIAS_POINTER";
    return "";
}

}  // namespace
}  // namespace qk::emu

using qk::emu::refuse;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = qk::emu::LtHandles::get().create();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    return qk::emu::LtHandles::get().destroy(lightHandle) ? CUBLAS_STATUS_SUCCESS
                                                          : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      fmt::format("cublasLtMatmulDescCreate: the emulation takes "
                                  "CUBLAS_COMPUTE_32F with CUDA_R_32F scales, got {} and {}",
                                  int(computeType), int(scaleType)));
    *matmulDesc = new cublasLtMatmulDescOpaque_t;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t size) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t i32 = 0;
    uint32_t u32 = 0;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
        case CUBLASLT_MATMUL_DESC_TRANSB:
            if ((status = qk::emu::read_attribute(i32, buf, size)) != CUBLAS_STATUS_SUCCESS)
                return status;
            if (i32 != CUBLAS_OP_N && i32 != CUBLAS_OP_T && i32 != CUBLAS_OP_C)
                return CUBLAS_STATUS_INVALID_VALUE;
            (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->transa : desc->transb) =
                static_cast<cublasOperation_t>(i32);
            return status;
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            if ((status = qk::emu::read_attribute(u32, buf, size)) != CUBLAS_STATUS_SUCCESS)
                return status;
            if (u32 != CUBLASLT_EPILOGUE_DEFAULT && u32 != CUBLASLT_EPILOGUE_BIAS)
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                              fmt::format("cublasLtMatmulDescSetAttribute: the emulation's "
                                          "epilogues are DEFAULT and BIAS, got {}",
                                          u32));
            desc->epilogue = static_cast<cublasLtEpilogue_t>(u32);
            return status;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            return qk::emu::read_attribute(desc->bias, buf, size);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
            return qk::emu::read_attribute(desc->bias_type, buf, size);
    }
    return refuse(
        CUBLAS_STATUS_NOT_SUPPORTED,
        fmt::format("cublasLtMatmulDescSetAttribute: attribute {} is not emulated", int(attr)));
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    if (ld < 1 || uint64_t(ld) < rows || rows > INT32_MAX || cols > INT32_MAX || ld > INT32_MAX)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      fmt::format("cublasLtMatrixLayoutCreate: {} x {} with ld {} (ld must be at "
                                  "least max(1, rows), sizes within int)",
                                  rows, cols, ld));
    *matLayout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new cublasLtMatmulPreferenceOpaque_t;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t size) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return qk::emu::read_attribute(pref->max_workspace, buf, size);
    uint32_t alignment = 0;  // the shim's kernels read any alignment
    return qk::emu::read_attribute(alignment, buf, size);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
    if (!qk::emu::live(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!op || !a || !b || !c || !d || !preference || requested < 1 || !results || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    if (const std::string bad = qk::emu::bad_shapes(*op, *a, *b, *c, *d); !bad.empty())
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: " + bad);
    if (const std::string why = qk::emu::unsupported(*op, *a, *b, *c, *d); !why.empty())
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic: " + why);
    results[0] = {};
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t op,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t a,
                              const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t*, void*,
                              std::size_t, cudaStream_t) {
    constexpr const char* api = "cublasLtMatmul";
    if (!qk::emu::live(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!op || !a || !b || !c || !d || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (const std::string bad = qk::emu::bad_shapes(*op, *a, *b, *c, *d); !bad.empty())
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fmt::format("{}: {}", api, bad));
    if (const std::string why = qk::emu::unsupported(*op, *a, *b, *c, *d); !why.empty())
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fmt::format("{}: {}", api, why));
    const int m = int(d->rows), n = int(d->cols);
    const int k = int(op->transa == CUBLAS_OP_N ? a->cols : a->rows);
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    const float beta_value = *static_cast<const float*>(beta);
    const std::size_t d_bytes = sizeof(float) * (std::size_t(d->ld) * (n - 1) + m);
    if (beta_value != 0.0f && C != D) {  // D = beta · C first: the GEMM below then adds to D
        qk::emu::detail::require_device_range(api, "C", C,
                                              sizeof(float) * (std::size_t(c->ld) * (n - 1) + m));
        qk::emu::detail::require_device_range(api, "D", D, d_bytes);
        if (!qk::cuda::ledger::dry_run())
            for (int j = 0; j < n; ++j)
                std::memcpy(static_cast<float*>(D) + std::size_t(j) * d->ld,
                            static_cast<const float*>(C) + std::size_t(j) * c->ld,
                            sizeof(float) * m);
    }
    const cublasStatus_t status = cublasGemmStridedBatchedEx(
        qk::emu::gemm_handle(), op->transa, op->transb, m, n, k, alpha, A, a->type, int(a->ld), 0,
        B, b->type, int(b->ld), 0, beta, D, CUDA_R_32F, int(d->ld), 0, 1, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_SUCCESS || op->epilogue != CUBLASLT_EPILOGUE_BIAS) return status;
    qk::emu::detail::require_device_range(api, "the bias", op->bias, sizeof(float) * m);
    if (qk::cuda::ledger::dry_run()) return CUBLAS_STATUS_SUCCESS;  // checked, not computed
    // The epilogue: D += bias, one value per row of D, after the sums and before D is stored.
    const float* bias = static_cast<const float*>(op->bias);
    for (int j = 0; j < n; ++j) {
        float* column = static_cast<float*>(D) + std::size_t(j) * d->ld;
        for (int i = 0; i < m; ++i) column[i] += bias[i];
    }
    return CUBLAS_STATUS_SUCCESS;
}
