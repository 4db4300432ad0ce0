// CUDA fused attention on tensor cores: FlashAttention-2's forward with bf16 or fp16 q, k, v,
// float32 softmax statistics and output. The math (r, s, z, p, the online softmax, the signals)
// is derived in ops/attention.cpp; cuda/attention.cu is the CUDA-core twin it is tested against,
// and docs/fused-attention.md draws the tiles and fragments.
//
// Work split. A block is 4 warps and owns 64 query rows of one head (blockIdx.y); warp w owns rows
// 16w … 16w + 15, whose q stays in registers as mma A fragments for the whole kernel (read from
// shared memory at each use when D = 256: its fragments would not fit beside the output). The block
// walks the key tiles of 64 keys that its rows see; per tile, each warp
//   1. S = Q Kᵀ: 16 × 64 logits, D/16 · 8 mma.m16n8k16 (K's rows are B's columns: ldmatrix without
//      .trans), accumulated in float32 registers, 32 per lane;
//   2. the online softmax on those registers: lane (g, t) holds columns 2t, 2t + 1 of every 8-key
//      block of rows g and g + 8 (cuda/mma.h), so a row's max is a max over the 4 lanes of group g
//      (two xor shuffles); m moves, l, w and the output are rescaled by α = exp(m − m'), and each
//      logit becomes e = exp(z − m') (as 2^((z − m')·log2 e): one multiply before the exp2).
//      On a tile off the mask's edge without a cap or FP8 logits (outside the signals' variant),
//      z − m' is one fused multiply-add from r, and the loops over the 32 values hold only that.
//   3. O += P V: the e of two adjacent 8-key blocks are exactly an A fragment of P (16 rows × 16
//      keys) once rounded to H — no trip through shared memory — and V's rows are keys, so its B
//      fragments come from ldmatrix .trans; D/8 · 4 mma.
// The row sums l and w stay per lane (each lane's 16 columns) and meet in one quad sum at the end.
//
// Memory. Shared memory holds the q tile (read once into fragments), one key tile and one value
// tile, 64 × D each in H (24, 48, 96 KB at D = 64, 128, 256), filled by cp.async: the value tile's
// copy runs under step 1-2, the next key tile's under step 3. Each row of a tile is D/8 chunks of
// 16 bytes, stored at chunk ^ (row % 8): the 8 rows one ldmatrix reads at one column then sit in
// 8 different bank groups instead of one (an 8-way conflict unswizzled).
//
// Precision. Products of H values are exact in float32 and the mma sums them in float32, so S is
// the CUDA-core kernel's r up to the order of the sum; P is rounded to H before O += P V (l is
// summed from the unrounded e), which moves o_i by at most 2^-8 Σ_j p_ij |v_j| in bf16 (2^-11 in
// fp16): the bound tests/test_cuda_attention_mma.cpp derives and holds the kernel to.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "cuda/attention_mma.h"
#include "cuda/bf16_convert.h"

namespace qk::cuda {

namespace {

using tc::kThreads;
constexpr int kBlockRows = tc::kTileRows;  // query rows per block, 16 per warp
constexpr int kKeys = tc::kTileRows;       // keys per tile

// x is never NaN here (the maxima it takes skip NaNs), so fmaxf is the comparison: one instruction.
__device__ __forceinline__ float quad_max(float x) {
    for (int offset = 1; offset < 4; offset *= 2)
        x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
    return x;
}

__device__ __forceinline__ float quad_sum(float x) {
    for (int offset = 1; offset < 4; offset *= 2) x += __shfl_xor_sync(kFullMask, x, offset);
    return x;
}

// One row's running softmax state, as in cuda/attention.cu: max, Σ e, Σ e·z, max |s|, saturated.
struct RowState {
    float m = -INFINITY, l = 0, w = 0, max_abs = 0, saturated = 0;
};

// The logits z of a tile that is not plain: s = g·r, max |s| with kSignals (in tile_abs), the cap
// and FP8 rounding where asked, −inf where kMasked and the mask hides the pair.
template <bool kSignals, bool kMasked>
__device__ __forceinline__ void logits(float (&s)[kKeys / 8][4], RowState (&st)[2],
                                       float (&tile_abs)[2], const tc::TileMask& mask, float gain,
                                       float cap, const AttentionShape& sh) {
    const int lane = threadIdx.x % kWarp;
    // Element idx of this lane's 32: 8-key block idx / 4, register idx % 4, row (idx % 4) / 2.
    auto visible = [&](int idx) {
        const int row = lane / 4 + 8 * (idx % 4 / 2), key = 8 * (idx / 4) + 2 * (lane % 4);
        return !kMasked || mask.sees(row, key + idx % 2);
    };
    QK_UNROLL
    for (int idx = 0; idx < kKeys / 2; ++idx) s[idx / 4][idx % 4] *= gain;  // s = g·r
    if (kSignals) {  // max |s|, before the cap
        QK_UNROLL
        for (int idx = 0; idx < kKeys / 2; ++idx) {
            const float a = fabsf(s[idx / 4][idx % 4]);
            if (visible(idx) && a > tile_abs[idx % 4 / 2]) tile_abs[idx % 4 / 2] = a;
        }
    }
    if (cap > 0 || sh.fp8_logits) {  // z = z̃(cap(s))
        QK_UNROLL
        for (int idx = 0; idx < kKeys / 2; ++idx) {
            float& z = s[idx / 4][idx % 4];
            z = logit_used(capped(z, cap), sh.fp8_logits);
            if (kSignals && sh.fp8_logits && visible(idx) && fabsf(z) >= 448.0f)
                st[idx % 4 / 2].saturated += 1;
        }
    }
    if (kMasked) {
        QK_UNROLL
        for (int idx = 0; idx < kKeys / 2; ++idx)
            if (!visible(idx)) s[idx / 4][idx % 4] = -INFINITY;
    }
}

// A row max of at least this much takes a plain tile's exponent from s = g·r (online_softmax).
constexpr float kFusedExponentLimit = 0x1p16f;  // |m'|·2⁻²⁴ <= 2⁻⁸

// Step 2 on one key tile: s holds the warp's 16 × 64 raw dots r (this lane's share) and leaves
// holding e = exp(z − m') (0 where masked); o is rescaled by α. masked: whether any (row, key)
// pair of the block's tile is hidden (else none is tested); mask_of(): the warp's tile's mask
// (tc::TileMask), made only where asked.
// kSignals: also carry max |s|, w = Σ e·z (for the entropy) and the saturated count.
// gain: g ≥ 0 (or NaN); the kernel negated q where the scale is negative, which gives the same
// s = g·r to the bit.
//
// The plain tile (every pair visible, no cap, FP8 logits or signals; nearly every tile of a long
// causal run) never forms s. Its max is g·max r, which is max s to the bit (g ≥ 0 and rounding is
// monotone), and each exponent z − m' is one fused multiply-add from r, rounded once where
// s − m' rounded twice (docs/cuda.md, "Counting instructions without a GPU"). The exact product
// g·r of the max's own pair then differs from m' = fl(g·max r) by up to |m'|·2⁻²⁴, which its e
// carries as exp(±|m'|·2⁻²⁴): harmless below kFusedExponentLimit, where the warp takes the plain
// path; a max beyond it (or ±inf, NaN: g·r overflowing) forms s = fl(g·r) after all, so that the
// max's e is 1 exactly and an overflow is NaN, as on the cpu.
// plain_rules: no cap and no FP8 logits (the kernel's, decided once).
template <bool kSignals, int kDTiles, class MaskOf>
__device__ void online_softmax(float (&s)[kKeys / 8][4], float (&o)[kDTiles][4], RowState (&st)[2],
                               bool masked, const MaskOf& mask_of, bool plain_rules, float gain,
                               float cap, const AttentionShape& sh) {
    bool plain = !kSignals && !masked && plain_rules;
    float tile_abs[2] = {0, 0};
    if (!plain && masked)  // two straight lines: asked inside one, `masked` cost a select a value
        logits<kSignals, true>(s, st, tile_abs, mask_of(), gain, cap, sh);
    else if (!plain)
        logits<kSignals, false>(s, st, tile_abs, tc::TileMask::everything(), gain, cap, sh);
    float tile_max[2] = {-INFINITY, -INFINITY};
    QK_UNROLL
    for (int idx = 0; idx < kKeys / 2; ++idx) {  // a NaN z is skipped here, and makes l NaN below
        // fmaxf returns the number when one side is NaN, as `z > m ? z : m` does: one instruction
        // (FMNMX) where the comparison took two.
        float& m = tile_max[idx % 4 / 2];
        m = fmaxf(m, s[idx / 4][idx % 4]);
    }
    float m_new[2], m_ref[2];
    bool moved = false, large = false;
    QK_UNROLL
    for (int r = 0; r < 2; ++r) {
        const float m_tile = plain ? gain * quad_max(tile_max[r]) : quad_max(tile_max[r]);
        m_new[r] = m_tile > st[r].m ? m_tile : st[r].m;
        m_ref[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r];  // nothing finite yet: e = 0, not NaN
        moved = moved || m_new[r] != st[r].m;
        large = large || !(fabsf(m_new[r]) < kFusedExponentLimit);
        if (kSignals) {
            const float abs_tile = quad_max(tile_abs[r]);
            st[r].max_abs = abs_tile > st[r].max_abs ? abs_tile : st[r].max_abs;
        }
    }
    // Where no row of the warp has a new max, α = exp(m − m') is exactly 1 (or 0 on a row that
    // has seen no finite logit, whose o, l and w are 0 or NaN, which 0 keeps; NaN on a row whose
    // max is +inf, whose l is NaN since the tile that brought the +inf): the rescaling would
    // leave every value as it is, so the warp skips it. With random logits tile k raises a row's
    // max with probability 1/k: at T = 4096, 2 tiles in 5 of a causal run skip (more where the max
    // settles early, as on an attention sink). One vote asks both questions on the plain path.
    if (__any_sync(kFullMask, moved || (plain && large))) {
        if (plain && __any_sync(kFullMask, large)) {  // s = fl(g·r) after all (see above)
            plain = false;
            QK_UNROLL
            for (int idx = 0; idx < kKeys / 2; ++idx)
                s[idx / 4][idx % 4] = __fmul_rn(s[idx / 4][idx % 4], gain);  // not fused below
        }
        QK_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float alpha = exp_via_exp2(st[r].m - m_ref[r]);
            st[r].l *= alpha;
            st[r].w *= alpha;
            QK_UNROLL
            for (int d = 0; d < kDTiles; ++d) {  // registers 2r, 2r + 1: row r of the lane's pair
                o[d][2 * r] *= alpha;
                o[d][2 * r + 1] *= alpha;
            }
        }
    }
    st[0].m = m_new[0];
    st[1].m = m_new[1];
    if (plain) {
        QK_UNROLL
        for (int idx = 0; idx < kKeys / 2; ++idx) {
            const int j = idx / 4, i = idx % 4;
            const float e = exp_via_exp2_ftz(fmaf(s[j][i], gain, -m_ref[i / 2]));  // s[j][i] = r
            st[i / 2].l += e;
            s[j][i] = e;
        }
    } else {
        QK_UNROLL
        for (int idx = 0; idx < kKeys / 2; ++idx) {
            const int j = idx / 4, i = idx % 4;
            RowState& rs = st[i / 2];
            const float z = s[j][i], e = exp_via_exp2_ftz(z - m_ref[i / 2]);  // masked: 0
            rs.l += e;
            if (kSignals) rs.w += e > 0.0f ? e * z : 0.0f;
            s[j][i] = e;
        }
    }
}

// Blocks per SM asked of the register allocator (__launch_bounds__): more warps to hide the
// latencies of the softmax's dependent chains, at the cost of a few spilled registers; the
// signals' variant (stats steps only) keeps its registers.
template <int D, bool kSignals>
constexpr int forward_blocks_per_sm() {
    if (kSignals) return 1;
    return D == 64 ? 4 : D == 128 ? 3 : 1;
}

template <class H, int D, bool kSignals>
__global__ void __launch_bounds__(kThreads, (forward_blocks_per_sm<D, kSignals>()))
    attention_forward_mma_kernel(float* out, double* lse, float* max_abs_s, float* entropy,
                                 float* saturated, const uint16_t* q, const uint16_t* k,
                                 const uint16_t* v, const float* scale, int64_t scale_stride,
                                 float cap, AttentionShape sh, uint16_t* out_h) {
    constexpr int kDTiles = D / 8;
    QK_DYNAMIC_SHARED(double, smem);                    // double: 16-byte chunks stay aligned
    uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);  // (64, D) swizzled
    uint16_t* k_s = q_s + kBlockRows * D;               // (64, D)
    uint16_t* v_s = k_s + kKeys * D;                    // (64, D)
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    // The last query tiles first: under the causal mask they see the most keys, and a long block
    // started last would run alone at the end.
    const int64_t bh = blockIdx.y, i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;
    const int64_t rows = sh.Tq - i0 < kBlockRows ? sh.Tq - i0 : kBlockRows;
    // A negative scale: q negated below, so that every tile sees g ≥ 0 (online_softmax).
    const float signed_gain = scale[(bh % sh.heads) * scale_stride], gain = fabsf(signed_gain);
    const int64_t kv_first = sh.kv_head(bh) * sh.Tk;
    const int64_t key_begin = sh.first_key(i0) / kKeys * kKeys, key_end = sh.end_key(i0 + rows - 1);
    const int64_t row[2] = {i0 + 16 * warp + lane / 4, i0 + 16 * warp + lane / 4 + 8};
    auto load_keys = [&](uint16_t* tile, const uint16_t* src, int64_t j0) {
        const int64_t valid = key_end - j0 < kKeys ? key_end - j0 : kKeys;
        tc::load_tile_async<D>(tile, src + (kv_first + j0) * D, valid);
        mma::cp_async_commit();
    };
    tc::load_tile_async<D>(q_s, q + (bh * sh.Tq + i0) * D, rows);
    if (key_begin < key_end) load_keys(k_s, k, key_begin);  // one group: q and the first keys
    if (key_begin < key_end) load_keys(v_s, v, key_begin);

    if (signed_gain < 0 && key_begin < key_end) {  // g·r = |g|·((−q)·k), an exact 0's sign aside
        mma::cp_async_wait<1>();                   // q (and the first key tile) are in
        __syncthreads();
        tc::negate_tile<D>(q_s);
        __syncthreads();
    }
    const bool plain_rules = cap == 0 && !sh.fp8_logits;
    const tc::FullyVisibleKeys full_keys = tc::fully_visible_keys(i0, sh);
    uint32_t q_frag[D <= 128 ? D / 16 : 1][4];  // D = 256: read from q_s at each use instead
    float o[kDTiles][4] = {};
    RowState st[2];
    for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeys) {
        const bool last = j0 + kKeys >= key_end;
        mma::cp_async_wait<1>();  // q and this key tile are in (the value tile may not be)
        __syncthreads();
        float s[kKeys / 8][4] = {};
        if constexpr (D <= 128) {  // step 1: S = Q Kᵀ
            if (j0 == key_begin) tc::load_row_fragments<D>(q_frag, q_s, 16 * warp);
            tc::mma_rows_by_tile<H, D>(s, q_frag, k_s);
        } else {
            tc::mma_rows_by_tile<H, D>(s, q_s, 16 * warp, k_s);
        }
        const bool masked = !full_keys.has(j0);
        online_softmax<kSignals>(  // step 2
            s, o, st, masked, [&] { return tc::tile_mask(i0 + 16 * warp, j0, sh); }, plain_rules,
            gain, cap, sh);
        mma::cp_async_wait<0>();
        __syncthreads();  // the value tile is in; every warp is done with the key tile
        if (!last) load_keys(k_s, k, j0 + kKeys);
        tc::mma_scores_by_tile<H, D>(o, s, v_s);  // step 3: O += P V
        __syncthreads();                          // every warp is done with the value tile
        if (!last) load_keys(v_s, v, j0 + kKeys);
    }
    mma::cp_async_wait<0>();  // nothing left in flight at exit (a block that saw no key)

    const int t = lane % 4;
    QK_UNROLL
    for (int r = 0; r < 2; ++r) {
        st[r].l = quad_sum(st[r].l);
        st[r].w = quad_sum(st[r].w);
        st[r].saturated = quad_sum(st[r].saturated);
        if (row[r] >= sh.Tq) continue;
        const int64_t at = bh * sh.Tq + row[r];  // the row's statistics
        const int64_t out_at = sh.out_row(bh, row[r]) * D;
        const float l = st[r].l;
        QK_UNROLL
        for (int e = 0; e < kDTiles * 2; ++e) {  // 8-column block d, column h of the lane's pair
            const int d = e / 2, h = e % 2;
            const float value = l > 0.0f ? o[d][2 * r + h] / l : 0.0f;
            out[out_at + 8 * d + 2 * t + h] = value;
            store_half(out_h, out_at + 8 * d + 2 * t + h, value, std::is_same_v<H, bf16>);
        }
        if (t != 0) continue;
        const bool nan_row = l != l;
        const double row_lse =
            l > 0.0f ? double(st[r].m) + log(double(l)) : (nan_row ? double(l) : -INFINITY);
        lse[at] = row_lse;
        if (max_abs_s) {
            max_abs_s[at] = nan_row ? l : st[r].max_abs;
            entropy[at] =
                l > 0.0f ? float(row_lse - double(st[r].w) / double(l)) : (nan_row ? l : 0.0f);
        }
        if (saturated) saturated[at] = st[r].saturated;
    }
}

}  // namespace

bool attention_mma_supports(int64_t D) { return D == 64 || D == 128 || D == 256; }

int64_t attention_mma_mask_mismatches(const AttentionShape& sh) {
    auto seen = [&](int64_t i, int64_t j) { return i < sh.Tq && j < sh.Tk && sees(i, j, sh); };
    int64_t wrong = 0;
    // The forward and dQ: query blocks at multiples of 64, a mask per warp's 16 rows.
    for (int64_t i0 = 0; i0 < sh.Tq; i0 += kBlockRows)
        for (int64_t j0 = 0; j0 < sh.Tk; j0 += kKeys) {
            bool every = true;
            for (int64_t w0 = i0; w0 < i0 + kBlockRows; w0 += 16) {
                const tc::TileMask mask = tc::tile_mask(w0, j0, sh);
                for (int qi = 0; qi < 16; ++qi)
                    for (int kj = 0; kj < kKeys; ++kj) {
                        every = every && seen(w0 + qi, j0 + kj);
                        wrong += mask.sees(qi, kj) != seen(w0 + qi, j0 + kj);
                    }
            }
            wrong += tc::fully_visible_keys(i0, sh).has(j0) != every;
            wrong += tc::tile_fully_visible(i0, j0, sh) != every;  // the ranges' definition
        }
    // dK/dV: a key block's query tiles from the first row that sees it (any row, not a multiple
    // of 64), one mask per tile, asked with the keys as rows.
    for (int64_t j0 = 0; j0 < sh.Tk; j0 += kKeys) {
        const int64_t cols = sh.Tk - j0 < kKeys ? sh.Tk - j0 : kKeys;
        const KeyTileReaders readers = key_tile_readers(0, j0, cols, sh);
        for (int64_t i0 = readers.first_row; i0 < readers.end_row; i0 += kBlockRows) {
            const tc::TileMask mask = tc::tile_mask(i0, j0, sh);
            bool every = true;
            for (int kj = 0; kj < kKeys; ++kj)
                for (int qi = 0; qi < kBlockRows; ++qi) {
                    every = every && seen(i0 + qi, j0 + kj);
                    wrong += mask.sees(qi, kj) != seen(i0 + qi, j0 + kj);
                }
            wrong += tc::fully_visible_queries(j0, sh).has(i0) != every;
            wrong += tc::tile_fully_visible(i0, j0, sh) != every;
        }
    }
    return wrong;
}

namespace {

template <class H, int D>
void launch_forward(const dim3& grid, size_t smem, float* out, double* lse, float* max_abs_s,
                    float* entropy, float* saturated, const uint16_t* q, const uint16_t* k,
                    const uint16_t* v, const float* scale, int64_t scale_stride, float cap,
                    const AttentionShape& sh, uint16_t* out_h) {
    if (max_abs_s || saturated) {
        tc::allow_shared_memory(attention_forward_mma_kernel<H, D, true>, smem,
                                "attention forward");
        QK_LAUNCH((attention_forward_mma_kernel<H, D, true>), grid, kThreads, smem, stream(), out,
                  lse, max_abs_s, entropy, saturated, q, k, v, scale, scale_stride, cap, sh, out_h);
    } else {
        tc::allow_shared_memory(attention_forward_mma_kernel<H, D, false>, smem,
                                "attention forward");
        QK_LAUNCH((attention_forward_mma_kernel<H, D, false>), grid, kThreads, smem, stream(), out,
                  lse, max_abs_s, entropy, saturated, q, k, v, scale, scale_stride, cap, sh, out_h);
    }
}

}  // namespace

template <class H>
void attention_forward_mma(float* out, double* lse, float* max_abs_s, float* entropy,
                           float* saturated, const H* q, const H* k, const H* v, const float* scale,
                           int64_t scale_stride, float cap, const AttentionShape& sh,
                           uint16_t* out_h) {
    QK_CHECK(attention_mma_supports(sh.D),
             "attention on tensor cores: head dim D must be 64, 128 or 256, got {}", sh.D);
    if (sh.batch_heads == 0 || sh.Tq == 0) return;
    const dim3 grid(static_cast<unsigned>((sh.Tq + kBlockRows - 1) / kBlockRows),
                    static_cast<unsigned>(sh.batch_heads));
    const size_t smem = sizeof(uint16_t) * size_t(kBlockRows + 2 * kKeys) * size_t(sh.D);
    const double pairs = attention_pairs(sh), rows = double(sh.batch_heads * sh.Tq);
    // q once in H, k and v per query tile, out in float (and in H when asked); S and P·V on
    // tensor cores, ~12 FLOPs of softmax per pair on CUDA cores.
    ledger::declare(2 * tiles_bytes(sh, sizeof(H), kBlockRows, sh.Tq) +
                        rows * double(sh.D) * (sizeof(H) + sizeof(float) + (out_h ? 2 : 0)),
                    12 * pairs, 4 * double(sh.D) * pairs);
    const auto* q16 = reinterpret_cast<const uint16_t*>(q);
    const auto* k16 = reinterpret_cast<const uint16_t*>(k);
    const auto* v16 = reinterpret_cast<const uint16_t*>(v);
    const auto launch = sh.D == 64    ? launch_forward<H, 64>
                        : sh.D == 128 ? launch_forward<H, 128>
                                      : launch_forward<H, 256>;
    launch(grid, smem, out, lse, max_abs_s, entropy, saturated, q16, k16, v16, scale, scale_stride,
           cap, sh, out_h);
    QK_CUDA_CHECK_LAUNCH("attention_forward_mma_kernel");
}

template void attention_forward_mma<bf16>(float*, double*, float*, float*, float*, const bf16*,
                                          const bf16*, const bf16*, const float*, int64_t, float,
                                          const AttentionShape&, uint16_t*);
template void attention_forward_mma<f16>(float*, double*, float*, float*, float*, const f16*,
                                         const f16*, const f16*, const float*, int64_t, float,
                                         const AttentionShape&, uint16_t*);

}  // namespace qk::cuda
