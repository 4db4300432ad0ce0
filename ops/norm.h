// Normalisations over the last dim (layer_norm, rms_norm) or any dim (lp_normalize).
// The math, what each op saves and its backward are derived at the top of ops/norm.cpp
// (layer_norm, rms_norm) and ops/lp_normalize.cpp.
#pragma once

#include "core/host_device.h"
#include "core/tensor.h"
#include "ops/rope.h"

namespace qk {

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance).
// weight: (C), required; bias: (C) or an undefined Tensor for none. eps > 0.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  Precision rounded_copy = Precision::full, const RopeTables& rotate = {});

// y = x / sqrt(mean(x²) + eps) * weight over the last dim. weight: (C) or undefined for none
// (the parameter-free QK-RMSNorm variants). eps > 0.
// rounded_copy (both norms) bf16 / fp16: on cuda the kernel also writes y rounded for the mixed
// Linear that reads it next (a block's pre-norms feed c_attn and the MLP), kept as y's cast copy
// (ops/rounded_copy.h). The values do not change.
// rotate (both norms): RoPE's tables for x's dim −2 (ops/rope.h), or none: the result is then
// rope(norm(x), cos, sin), the QK-norm before RoPE of OLMo 2 and Qwen3 as one op. On cuda, heads
// of 64 or 128 values rotate in the norm's own pass (forward, and dy's inverse rotation in the
// backward), saving rope's two passes over q and k; elsewhere the same two steps run one after
// the other (and no rounded copy is kept).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6,
                Precision rounded_copy = Precision::full, const RopeTables& rotate = {});

// The residual add before a block's norm and the norm: sum = x + delta, normed = layer_norm(sum, …)
// or rms_norm(sum, …), the same values and gradients as the two ops (a residual stream goes on
// with sum, the block reads normed). On cuda, float32 rows of at most 1,024 values of one shape,
// one kernel pass reads x and delta and writes both, as llm.c's fused residual forward: the add's
// launch and a read of the sum saved. Elsewhere the two ops.
struct SumAndNorm {
    Tensor sum, normed;
};
SumAndNorm add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                          const Tensor& bias, double eps = 1e-5,
                          Precision rounded_copy = Precision::full);
SumAndNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                        double eps = 1e-6, Precision rounded_copy = Precision::full);

// y = x / max(‖x‖_p, eps) along `dim`, for any finite p >= 1 (p = 2 is L2 normalisation).
// At p = 1 the gradient uses the subgradient sign(x) of |x|, with sign(0) = 0.
// For dim != -1 the result is a (non-contiguous) view of the same shape as x.
Tensor lp_normalize(const Tensor& x, double p, int64_t dim = -1, double eps = 1e-12);

// The CPU kernels, declared here for the kernel-ladder tests and the benchmark. Each op has a
// naive v1 that mirrors the math (plain loops, one thread) and a fast v2 (no suffix) that the
// public functions call. Raw contiguous pointers, shapes in elements:
//   x, y, dx, dy: (rows, C);  mean, rstd, norm: (rows);  weight, bias, dweight, dbias: (C).
// weight/bias (and dweight/dbias) may be nullptr where the op allows "none". Instantiated for
// float and double.
namespace cpu {
template <class T>
void layer_norm_forward_v1(T* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                           int64_t rows, int64_t C, T eps);
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                        int64_t rows, int64_t C, T eps);
template <class T>
void layer_norm_backward_v1(T* dx, T* dweight, T* dbias, const T* dy, const T* x, const T* mean,
                            const T* rstd, const T* weight, int64_t rows, int64_t C);
template <class T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dy, const T* x, const T* mean,
                         const T* rstd, const T* weight, int64_t rows, int64_t C);

template <class T>
void rms_norm_forward_v1(T* y, T* rstd, const T* x, const T* weight, int64_t rows, int64_t C,
                         T eps);
template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* weight, int64_t rows, int64_t C, T eps);
template <class T>
void rms_norm_backward_v1(T* dx, T* dweight, const T* dy, const T* x, const T* rstd,
                          const T* weight, int64_t rows, int64_t C);
template <class T>
void rms_norm_backward(T* dx, T* dweight, const T* dy, const T* x, const T* rstd, const T* weight,
                       int64_t rows, int64_t C);

template <class T>
void lp_normalize_forward_v1(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p, T eps);
template <class T>
void lp_normalize_forward(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p, T eps);
template <class T>
void lp_normalize_backward_v1(T* dx, const T* dy, const T* x, const T* norm, int64_t rows,
                              int64_t C, T p, T eps);
template <class T>
void lp_normalize_backward(T* dx, const T* dy, const T* x, const T* norm, int64_t rows, int64_t C,
                           T p, T eps);
}  // namespace cpu

// The CUDA twins (cuda/norm.cu): device pointers, the same arguments and layout as the cpu
// kernels above. rms_norm_forward_v1 (one thread per row) is the ladder's naive rung, kept for the
// tests; the others are one warp per row, with dweight/dbias by a deterministic two-stage sum.
// Where row r of a norm's input starts (its C values contiguous): the input may be a view whose
// rows are not evenly spaced, such as the per-head q inside c_attn's output, (B, H, T) rows at
// three strides; it is then read where it lies instead of copied first. r is split over up to
// three dims, the last fastest.
struct NormRows {
    int rank = 1;
    int64_t sizes[3] = {1, 1, 1}, strides[3] = {0, 0, 0};
    QK_HOST_DEVICE int64_t offset(int64_t r) const {
        int64_t at = 0;
        for (int d = rank - 1; d > 0; --d) {
            at += (r % sizes[d]) * strides[d];
            r /= sizes[d];
        }
        return at + r * strides[0];
    }
    static NormRows contiguous(int64_t rows, int64_t C) { return {1, {rows, 1, 1}, {C, 0, 0}}; }
};

namespace cuda {
// A rotary embedding (ops/rope.h) that the short-row kernels apply to a norm's rows of C = 64 or
// 128 values (norm_rotates): to y on the way out in the forward, to dy on the way in (by the
// opposite angle) in the backward. Row r sits at position r % positions; cos, sin: (positions,
// C/2). cos null: no rotation.
template <class T>
struct RowRotation {
    const T* cos = nullptr;
    const T* sin = nullptr;
    int64_t positions = 1;
};
// The residual add before a block's norm, in the norm's forward pass (add_layer_norm,
// add_rms_norm): the kernel normalises x + delta and writes that sum to `sum`. delta, sum: (rows,
// C) contiguous; null delta: no add. Only where the rows are held in registers (norm_adds_rows).
template <class T>
struct RowAdd {
    const T* delta = nullptr;
    T* sum = nullptr;
};
// Whether the forward kernels take a RowAdd for float32 rows of C values: where cuda/norm_rows.h's
// row_layout holds float rows in registers, C <= 1,024 (the launcher checks it agrees).
inline bool norm_adds_rows(int64_t C) { return C <= 1024; }

// Whether the kernels below rotate rows of C values in the same pass: C = 64 or 128, where each
// lane's values include both halves of its pairs (others: ops/norm.cpp rotates in a second pass).
inline bool norm_rotates(int64_t C) { return C == 64 || C == 128; }

// x's rows where x_rows says; y, dy, dx contiguous (rows, C). y_half: null, or (rows, C) out, y
// rounded to bf16 (half_is_bf16) or fp16 bits (the op's rounded_copy).
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const NormRows& x_rows, const T* weight,
                        const T* bias, int64_t rows, int64_t C, T eps, uint16_t* y_half = nullptr,
                        bool half_is_bf16 = true, const RowRotation<T>& rotation = {},
                        const RowAdd<T>& add = {});
// The backwards: add_into_dx adds dx to what dx holds (a residual stream's gradient so far, which
// the autograd engine hands a norm: Node::adds_into_input_gradient) where it would overwrite it.
template <class T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dy, const T* x,
                         const NormRows& x_rows, const T* mean, const T* rstd, const T* weight,
                         int64_t rows, int64_t C, const RowRotation<T>& rotation = {},
                         bool add_into_dx = false);
template <class T>
void rms_norm_forward_v1(T* y, T* rstd, const T* x, const T* weight, int64_t rows, int64_t C,
                         T eps);
template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const NormRows& x_rows, const T* weight,
                      int64_t rows, int64_t C, T eps, uint16_t* y_half = nullptr,
                      bool half_is_bf16 = true, const RowRotation<T>& rotation = {},
                      const RowAdd<T>& add = {});
template <class T>
void rms_norm_backward(T* dx, T* dweight, const T* dy, const T* x, const NormRows& x_rows,
                       const T* rstd, const T* weight, int64_t rows, int64_t C,
                       const RowRotation<T>& rotation = {}, bool add_into_dx = false);
template <class T>
void lp_normalize_forward(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p, T eps);
template <class T>
void lp_normalize_backward(T* dx, const T* dy, const T* x, const T* norm, int64_t rows, int64_t C,
                           T p, T eps);
}  // namespace cuda

}  // namespace qk
