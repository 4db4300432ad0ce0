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
__device__ __forceinline__ bool sees(int64_t i, int64_t j, const AttentionShape& sh) {
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

// Ledger costs (cuda/ledger.h), in cuda/attention.cu: the (row, key) pairs the mask keeps, and
// the bytes of the other side's tiles re-read by each of the `other` / tile_rows tiles.
double attention_pairs(const AttentionShape& sh);
double tiles_bytes(const AttentionShape& sh, int64_t size_of, int64_t tile_rows, int64_t other);

}  // namespace qk::cuda
