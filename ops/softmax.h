// Softmax and log-softmax over the last dim, with the attention options fused in.
#pragma once

#include "core/tensor.h"

namespace qk {

struct SoftmaxOptions {
    // Causal mask on the last two dims (..., Tq, Tk): row i sees keys j <= i + (Tk - Tq);
    // masked entries come out as exactly 0 (softmax) or -inf (log_softmax).
    bool causal = false;
    // When > 0, logits are soft-capped first: s <- cap * tanh(s / cap) (Gemma 2 uses 50).
    double softcap = 0;
    // bf16 / fp16, for a float32 softmax on cuda whose output a mixed GEMM reads next (attention's
    // p · v, and in the backward dS · k): the kernels also write y, and in the backward dx,
    // rounded to the half type, and keep it as that tensor's cast copy (cast_once, core/tensor.h),
    // so the GEMM finds its operand rounded without a pass of its own. The values are unchanged;
    // elsewhere the GEMM rounds them itself.
    Precision rounded_copy = Precision::full;
};

Tensor softmax(const Tensor& x, const SoftmaxOptions& options = {});
Tensor log_softmax(const Tensor& x, const SoftmaxOptions& options = {});

// The kernels behind softmax and log_softmax, declared for the kernel-level parity tests. Raw
// contiguous pointers, x seen as (rows, Tk), row r being query r mod Tq of a causal mask:
//   y, x, dx, dy: (rows, Tk);  lse: (rows), the saved log Σ exp per row.
// cap: the soft-cap c, 0 for none. Instantiated for float and double.
namespace cpu {
template <class T, bool kLog>
void softmax_forward(T* y, T* lse, const T* x, int64_t rows, int64_t Tq, int64_t Tk, bool causal,
                     T cap);
template <class T, bool kLog>
void softmax_backward(T* dx, const T* dy, const T* y, const T* lse, int64_t rows, int64_t Tq,
                      int64_t Tk, bool causal, T cap);
}  // namespace cpu

// The CUDA twins (cuda/softmax.cu): device pointers, the same layout; is_log selects log_softmax.
// half_out, when not null: (rows, Tk) out, the same values rounded to bf16 (half_is_bf16) or fp16
// bits (the softmax's rounded_copy).
namespace cuda {
template <class T>
void softmax_forward(T* y, T* lse, const T* x, int64_t rows, int64_t Tq, int64_t Tk, bool causal,
                     T cap, bool is_log, uint16_t* half_out = nullptr, bool half_is_bf16 = true);
template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, const T* lse, int64_t rows, int64_t Tq,
                      int64_t Tk, bool causal, T cap, bool is_log, uint16_t* half_out = nullptr,
                      bool half_is_bf16 = true);
}  // namespace cuda

}  // namespace qk
