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
// The materialised attention's softmax (ops/attention_materialized.cpp), float32 logits s:
// the forward writes p only rounded (p_half, bf16 bits when half_is_bf16, else fp16) and saves
// each row's max and Σ exp(z − max) (row_max, row_sum: (rows); row_sum NaN for a NaN row); the
// backward recomputes p from s and them and writes dS only rounded (ds_half). Causal rows are
// written up to the last key seen by their chunk of `chunk` query rows (the block-triangular
// GEMMs' reach), and not after; non-causal rows in full. The rounded values equal
// softmax_forward's and softmax_backward's half_out bit for bit.
//   p_half, ds_half: (rows, Tk) out;  s, dp: (rows, Tk);  row_max, row_sum: (rows).
void softmax_rounded_forward(uint16_t* p_half, float* row_max, float* row_sum, const float* s,
                             int64_t rows, int64_t Tq, int64_t Tk, bool causal, float cap,
                             int64_t chunk, bool half_is_bf16);
void softmax_rounded_backward(uint16_t* ds_half, const float* dp, const float* s,
                              const float* row_max, const float* row_sum, int64_t rows, int64_t Tq,
                              int64_t Tk, bool causal, float cap, int64_t chunk, bool half_is_bf16);
}  // namespace cuda

}  // namespace qk
