// What the two CUDA fused-attention kernels share (cuda/attention.cu on CUDA cores,
// cuda/attention_mma.cu on tensor cores): the mask, the soft-cap and the FP8 logit, per pair.
// The math is in ops/attention.cpp.
#pragma once

#include <cstdint>

#include "core/minifloat.h"
#include "cuda/warp_reduce.h"
#include "ops/attention.h"

namespace qk::cuda {

// Whether row i sees key j (AttentionShape: the causal mask and the sliding window).
__host__ __device__ __forceinline__ bool sees(int64_t i, int64_t j, const AttentionShape& sh) {
    return j >= sh.first_key(i) && j < sh.end_key(i);
}

template <class T>
__device__ __forceinline__ T capped(T s, T cap) {
    return cap > T(0) ? cap * dev_tanh(s / cap) : s;
}

// z̃: z rounded to E4M3 (saturating at ±448) with FP8 logits, else z (as on the cpu).
template <class T>
__device__ __forceinline__ T logit_used(T z, bool fp8) {
    return fp8 ? T(FastRounder(MiniFormat::e4m3, Overflow::saturate)(float(z))) : z;
}

// Who reads key tile [j0, j0 + cols) of key/value head kvh, for the dK/dV kernels: query rows
// [first_row, end_row) — from the first that sees key j0 to the last that still sees key
// j0 + cols − 1 under a window (row i sees j while i + Tk − Tq − window < j) — of query heads
// [first_bh, first_bh + group), the heads sharing kvh.
struct KeyTileReaders {
    int64_t first_row, end_row, first_bh, group;
};
__host__ __device__ __forceinline__ KeyTileReaders key_tile_readers(int64_t kvh, int64_t j0,
                                                                    int64_t cols,
                                                                    const AttentionShape& sh) {
    const int64_t shift = sh.Tk - sh.Tq;
    int64_t first_row = sh.causal ? j0 - shift : 0;
    first_row = first_row < 0 ? 0 : first_row;
    int64_t end_row = sh.window > 0 ? j0 + cols - 1 + sh.window - shift : sh.Tq;
    end_row = end_row < sh.Tq ? end_row : sh.Tq;
    const int64_t group = sh.heads / sh.kv_heads;
    return {first_row, end_row, (kvh / sh.kv_heads) * sh.heads + (kvh % sh.kv_heads) * group,
            group};
}

// p_ij and ds_ij of one visible (row i, key j) pair from its dots r = q_i·k_j and dp = dO_i·v_j,
// as on the cpu: p from z̃ (the rounded logit with FP8 logits) and the row's float64 lse split in
// two T (lse_hi + lse_lo); the cap's factor from z (the rounding is straight-through).
// exp(x) as 2^(x·log2 e), for the tensor-core kernels: one multiply before the hardware's exp2
// (expf adds a careful range reduction). x = z − m is formed first, so the product's rounding is
// relative to that difference, not to z: the result keeps float32's accuracy to a few ulps.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp_via_exp2(float x) { return exp2f(x * kLog2e); }

// The same with results below float32's normal range (x < −126 after the multiply) flushed to 0:
// the hardware's exp2 alone (ex2.approx.ftz), where exp2f adds a test and two multiplies to keep
// subnormal results. For the forward's e and the backward's p in the tensor-core kernels: an e or
// p below 2⁻¹²⁶ moves an output by at most 2⁻¹²⁶ times the values it multiplies (and l, which holds
// an e = 1, not at all). (The backward's tested tiles keep exp_via_exp2: their rule is shared with
// the CUDA-core kernel.)
// exp2_ftz(y) is that exp2 itself, 2^y, for a caller that forms y = x·log2 e in its own way.
__device__ __forceinline__ float exp2_ftz(float y) {
#if defined(__CUDA_ARCH__)
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(y));
    return e;
#else
    const float e = exp2f(y);
    return e < 1.17549435e-38f ? 0.0f : e;
#endif
}
__device__ __forceinline__ float exp_via_exp2_ftz(float x) { return exp2_ftz(x * kLog2e); }

template <class T, bool kViaExp2 = false>
__device__ __forceinline__ void probability_and_grad(T& p, T& ds, T r, T dp, T g, T cap, bool fp8,
                                                     T lse_hi, T lse_lo, T row_delta) {
    const T z = capped(g * r, cap);
    const T x = (logit_used(z, fp8) - lse_hi) - lse_lo;
    if constexpr (kViaExp2)
        p = exp_via_exp2(x);
    else
        p = dev_exp(x);
    p = p < T(1) ? p : T(1);  // a p above 1 is rounding: see ops/attention.cpp
    ds = p * (dp - row_delta);
    if (cap > T(0)) ds *= T(1) - (z / cap) * (z / cap);
    if (p == T(0)) ds = 0;  // 0 even where dp is not finite
}

// The CUDA-core backward's first step (the tensor-core one rounds dO in the same pass), and the
// last step of both (cuda/attention.cu):
//   delta: (BH, Tq) out, D_i = dO_i · O_i;
//   dq: (BH, Tq, D) in place, Σ_j ds_ij k_j in, g times that out; dscale: (BH) out (or null),
//   Σ over the head of q · dq_in, with q in its own type Q (bf16 from the tensor-core kernels).
template <class T>
void attention_delta(T* delta, const T* dout, const T* out, const AttentionShape& sh);
template <class T, class Q>
void attention_finish_dq(T* dq, T* dscale, const Q* q, const T* scale, int64_t scale_stride,
                         const AttentionShape& sh);

// Ledger costs (cuda/ledger.h), in cuda/attention.cu: the (row, key) pairs the mask keeps, and
// the bytes of the other side's tiles re-read by each of the `other` / tile_rows tiles.
double attention_pairs(const AttentionShape& sh);
double tiles_bytes(const AttentionShape& sh, int64_t size_of, int64_t tile_rows, int64_t other);

}  // namespace qk::cuda
