// Scaled dot-product attention, fused (FlashAttention-2's algorithm) and unfused (the composition
// of matmul and softmax it is tested against). The math and the tiling: ops/attention.cpp.
#pragma once

#include <optional>

#include "core/rng.h"
#include "core/tensor.h"

namespace qk {

struct AttentionOptions {
    // Causal mask: query row i sees keys j <= i + (Tk − Tq) (the last query sees every key), the
    // convention of softmax's causal mask.
    bool causal = false;
    // Sliding window (causal only): when > 0, query row i sees only the `window` most recent keys
    // up to its own, i + (Tk − Tq) − window < j (Gemma's local layers, Mistral).
    int64_t window = 0;
    // The logit scale, s = scale · q·k: a number (default 1/sqrt(D)) ...
    std::optional<double> scale = std::nullopt;
    // ... or a tensor of shape (1) or (H), one value per head, differentiable: the learnable g of
    // the l2/lp QK-norms. When defined it replaces `scale`.
    Tensor scale_tensor = {};
    // When > 0, s <- c · tanh(s / c) after the scale, before the mask (Gemma 2 uses 50).
    double softcap = 0;
    // Dropout on the attention probabilities, unfused path only (the fused kernel refuses p > 0).
    double dropout = 0;
    Generator* dropout_generator = nullptr;  // default_generator() when null
    // bf16 / fp16: q, k and v (float32) are rounded to bfloat16 / float16, as the inputs of mixed
    // GEMMs are, and the logits and the output are their float32 sums (as a fused kernel keeps
    // them, in registers); the signals measure those logits. The fused path on cuda with head dims
    // 64, 128 and 256 runs on tensor cores, which also round P (and in the backward dO and dS) to
    // the half type before their products (docs/fused-attention.md derives the bound). The
    // unfused composition rounds the same operands as the tensor cores do, on both devices: every
    // one of its GEMMs is matmul at this precision (ops/matmul.h), with q, k, v, p, and in the
    // backward dO and dS rounded, as PyTorch's autocast does.
    Precision precision = Precision::full;
    // Simulated FP8 logits (--fp8-attention): z = cap(s) rounded to E4M3 at scale 1 before the
    // mask and the softmax, saturating at ±448 (E4M3 has no Inf); straight-through in the
    // backward (dz̃/dz = 1). float32 only.
    bool fp8_logits = false;
};

// Stability signals, one value per query row, measured without gradient: (B, H, Tq) each.
struct AttentionSignals {
    Tensor max_abs_logit;  // max |s| over the row's visible keys (after the scale, before the cap)
    Tensor entropy;        // −Σ_j p_j log p_j of the row's attention distribution
    // With fp8_logits: how many of the row's visible logits saturated at E4M3's largest value
    // (|z̃| = 448); undefined otherwise.
    Tensor saturated;
};

// Fused attention. q: (B, H, Tq, D), k and v: (B, Hkv, Tk, D) -> (B, H, Tq, D):
//     out = softmax(mask(cap(scale · q kᵀ))) v
// Hkv divides H: with Hkv < H (grouped-query attention; Hkv = 1: multi-query), query head h reads
// key/value head h / (H / Hkv), as transformers' repeat_kv does, without copying k and v.
// computed tile by tile without the (Tq, Tk) scores; saves q, k, v, out and one log-sum-exp per
// row for the backward. float32 or float64, all on one device. Differentiable in q, k, v and the
// scale tensor. When `signals` is given it is filled by the same pass (no gradient).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionOptions& options = {}, AttentionSignals* signals = nullptr);

// The same attention from matmul, softmax (and dropout): the (B, H, Tq, Tk) scores and
// probabilities are materialised and saved by those ops. The reference for the fused op's tests
// and the model's `--attention naive`. Its signals are measured on the host from the T² tensors.
// At bf16 / fp16 on cuda (a scale number, no window, FP8 logits, dropout or signals) the same
// GEMMs and softmax run as one node that keeps fewer T² buffers and skips the causal mask's
// upper blocks (ops/attention_materialized.cpp); use_materialized_attention(false) turns that
// off, for the tests that compare the two. It returns the previous setting.
Tensor attention_unfused(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& options = {}, AttentionSignals* signals = nullptr);
bool use_materialized_attention(bool on);

// The kernels behind `attention`, declared for the kernel-level parity tests of the CUDA twin.
// Raw contiguous pointers; one (batch, head) pair is a "head" bh in [0, batch_heads), and uses the
// scale scale[(bh mod heads) · scale_stride] (stride 0: one scale for every head) and the key/value
// head kv_head(bh) of k, v: (batch · kv_heads, Tk, D).
struct AttentionShape {
    int64_t batch_heads, heads, kv_heads, Tq, Tk, D;
    bool causal;
    int64_t window = 0;       // sliding window, 0 = none
    bool fp8_logits = false;  // z rounded to E4M3 (saturating) before the softmax
    // The tensor-core kernels only: out laid out (B, Tq, H, D), the layout c_proj reads, where
    // (B, H, Tq, D) needs a copy to merge the heads. out_row(bh, i) is where row i of head bh is.
    bool out_by_time = false;
    constexpr int64_t out_row(int64_t bh, int64_t i) const {
        return out_by_time ? ((bh / heads) * Tq + i) * heads + bh % heads : bh * Tq + i;
    }
    // The key/value head that query head bh reads.
    constexpr int64_t kv_head(int64_t bh) const {
        return (bh / heads) * kv_heads + (bh % heads) / (heads / kv_heads);
    }
    // The keys query row i sees, [first_key(i), end_key(i)): the causal prefix up to
    // i + (Tk − Tq), its last `window` keys only with a window, or every key.
    constexpr int64_t end_key(int64_t i) const {
        return causal && i + (Tk - Tq) + 1 < Tk ? i + (Tk - Tq) + 1 : Tk;
    }
    constexpr int64_t first_key(int64_t i) const {
        return window > 0 && i + (Tk - Tq) + 1 - window > 0 ? i + (Tk - Tq) + 1 - window : 0;
    }
};
// Forward.  out: (BH, Tq, D) out; lse: (BH, Tq) out, log Σ_j exp(z_ij) per row, in float64
//   whatever T (see ops/attention.cpp: a float32 lse biases the backward's probabilities);
//   max_abs_s, entropy: (BH, Tq) out, or both null (no signals); saturated: (BH, Tq) out, the
//   row's logits at ±448 with shape.fp8_logits, or null;
//   q: (BH, Tq, D); k, v: (B·Hkv, Tk, D); cap: the soft-cap c, 0 for none.
// Backward. dq: (BH, Tq, D), dk, dv: (B·Hkv, Tk, D) out (every element written; a key/value
//   head's gradient sums over the query heads that share it, in a fixed order);
//   dscale: (BH) out, Σ over the head's logits of ∂loss/∂s · q·k, or null;
//   delta: (BH, Tq) workspace (D_i = dO_i · O_i); dout, out: (BH, Tq, D); lse: (BH, Tq).
// Instantiated for float and double.
namespace cpu {
template <class T>
void attention_forward(T* out, double* lse, T* max_abs_s, T* entropy, T* saturated, const T* q,
                       const T* k, const T* v, const T* scale, int64_t scale_stride, T cap,
                       const AttentionShape& shape);
template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* dscale, T* delta, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const double* lse, const T* scale,
                        int64_t scale_stride, T cap, const AttentionShape& shape);
}  // namespace cpu

// The CUDA twins (cuda/attention.cu): device pointers, the same layout and contract.
namespace cuda {
template <class T>
void attention_forward(T* out, double* lse, T* max_abs_s, T* entropy, T* saturated, const T* q,
                       const T* k, const T* v, const T* scale, int64_t scale_stride, T cap,
                       const AttentionShape& shape);
template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* dscale, T* delta, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const double* lse, const T* scale,
                        int64_t scale_stride, T cap, const AttentionShape& shape);
// The forward on tensor cores (cuda/attention_mma.cu), for bf16 and fp16 precision: q, k, v in
// H = bf16 or f16, everything else float32 (lse float64), the contract above otherwise; P is
// rounded to H before P·V. Head dims 64, 128 and 256 (attention_mma_supports). out_h: null, or
// out's values rounded to H, written beside them in out's layout (c_proj's input, rounded in the
// same pass: ops/rounded_copy.h).
bool attention_mma_supports(int64_t D);
// For tests, on the host: how many answers of the tensor-core kernels' tile masks (the tile's
// per-pair mask and the blocks' ranges of fully visible tiles, cuda/attention_mma.h) differ from
// the per-pair rule (row i < Tq sees key j < Tk when first_key(i) <= j < end_key(i)), over every
// 64 × 64 tile of the shape, asked as each kernel asks.
int64_t attention_mma_mask_mismatches(const AttentionShape& shape);
template <class H>
void attention_forward_mma(float* out, double* lse, float* max_abs_s, float* entropy,
                           float* saturated, const H* q, const H* k, const H* v, const float* scale,
                           int64_t scale_stride, float cap, const AttentionShape& shape,
                           uint16_t* out_h = nullptr);
// Where row (b, h, t) of a (B, H, T, D) tensor starts, its D values contiguous: dO as the
// backward receives it, usually a transposed view of the (B, T, H·D) gradient of c_proj's input.
struct RowStrides {
    int64_t batch, head, time;
};
// Its backward (cuda/attention_mma_backward.cu): dO float32 through its row strides, read once
// for D_i = dO · O (with the forward's float32 out) and rounded to H into dout_h (B, H, T, D)
// (scratch: the mma's input); q, k, v in H; float32 gradients.
template <class H>
void attention_backward_mma(float* dq, float* dk, float* dv, float* dscale, float* delta,
                            const float* dout, RowStrides dout_strides, H* dout_h, const H* q,
                            const H* k, const H* v, const float* out, const double* lse,
                            const float* scale, int64_t scale_stride, float cap,
                            const AttentionShape& shape);
}  // namespace cuda

}  // namespace qk
