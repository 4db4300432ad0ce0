// The cpu kernels of fused attention (the math, the names and the saved tensors:
// ops/attention.cpp).
//
// Tiles. Queries are cut into tiles of kQueryTile rows, keys into tiles of kKeyTile. For one
// (query tile, key tile) pair the kernel needs the (rows, cols) block of logits only, which it
// gets from one small GEMM (OpenBLAS, on the calling thread), and after the row math one more
// GEMM multiplies the block's probabilities into the output. A 64 × 64 block of floats is 16 KB:
// with the q, k, v and output tiles the working set stays in L2, where the unfused path streams
// the whole (T, T) matrix through memory four times (scores, probabilities, and their gradients).
// Under the causal mask a query tile stops at its last visible key, so the key tiles above the
// diagonal are never computed (half the work at large T); with a sliding window it also starts at
// the tile of its first row's first visible key, so a layer with window W costs O(T·W), not T².
// With grouped-query attention a query head reads its key/value head's rows in place.
//
// The products with Kᵀ and Vᵀ (R = Q Kᵀ, and dP = dO Vᵀ in backward) read k and v through a copy
// transposed head by head, (D, Tk) per head, made once per call: OpenBLAS's small-matrix kernels
// take 3.1 µs for a 64 × 64 × 32 product with a transposed operand and 1.8 µs without one, and
// the copy (about 4 % of a call) costs less than the three such products per block it saves
// (docs/performance.md#the-speedrun-step).
//
// Forward: one task per (head, query tile), in parallel over the pool. Per key tile:
//   R = Q_i K_jᵀ                          GEMM (rows × cols), the raw dots r (Kᵀ: the copy)
//   per row: s = g·r, z = cap(s) (rounded to E4M3 with FP8 logits), the online update of
//            (m, l, w) and the row's max |s| (and count of saturated z̃),
//            P = exp(z − m_new) in place of R, α = exp(m_old − m_new)
//   O_acc ← α·O_acc + P V_j                 GEMM (rows × D), beta = 1 after the α rescale
// and at the end O = O_acc / l, lse = m + log l, entropy = lse − w / l.
//
// Backward: one task per key/value head, which owns its dk and dv and the dq of the query heads
// that share it (one, without grouped-query attention), so nothing is shared between threads and
// the sums have a fixed order. Per query head of the group, per key tile j, per query tile i that
// sees it:
//   R = Q_i K_jᵀ;  P = exp(z − lse) (and the cap factor F = 1 − (z/c)²) recomputed per row
//   dV_j += Pᵀ dO_i                          GEMM
//   dP = dO_i V_jᵀ                            GEMM
//   dS = P ∘ (dP − D) ∘ F                     per row
//   dQ'_i += dS K_j;  dK_j += g · dSᵀ Q_i      GEMMs
// Five GEMMs per block where the unfused backward does the same five over the whole matrix. At
// the end of the head, dg = Σ_i q_i · dQ'_i (the same Σ dS ∘ R grouped by rows, with no
// multiply per logit) and dq = g · dQ'; cuda/attention.cu groups it the same way.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/minifloat.h"
#include "core/threading.h"
#include "ops/attention.h"
#include "ops/elementwise_math.h"  // math::exp_fast, math::tanh_fast
#include "ops/lane_sum.h"

namespace qk::cpu {

namespace {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;

template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();

// y (M × N, leading dim ldy) = alpha · op(a) · op(b) + beta · y, row-major, on this thread.
// op(a) is (M × K): a stored as is (lda) or transposed; likewise op(b) (K × N).
template <class T>
void tile_gemm(T* y, int64_t ldy, const T* a, bool a_trans, int64_t lda, const T* b, bool b_trans,
               int64_t ldb, int64_t M, int64_t N, int64_t K, T beta, T alpha = T(1)) {
    const auto ta = a_trans ? CblasTrans : CblasNoTrans, tb = b_trans ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, y, ldy);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, y, ldy);
}

// x: (heads, T, D) -> (heads, D, T), head by head in parallel.
template <class T>
std::vector<T> transpose_heads(const T* x, int64_t heads, int64_t T_len, int64_t D) {
    std::vector<T> out(static_cast<std::size_t>(heads * T_len * D));
    parallel_for(heads, [&](int64_t begin, int64_t end) {
        for (int64_t h = begin; h < end; ++h) {
            const T* in = x + h * T_len * D;
            T* o = out.data() + h * T_len * D;
            for (int64_t t = 0; t < T_len; ++t)
                for (int64_t d = 0; d < D; ++d) o[d * T_len + t] = in[t * D + d];
        }
    });
    return out;
}

// The cols of a key tile (starting at key j0) that row i sees: [first, end), 0 <= first <= end
// <= cols (first > 0 only under a sliding window).
struct TileSpan {
    int64_t first, end;
};
inline TileSpan visible_in_tile(int64_t i, int64_t j0, int64_t cols, const AttentionShape& sh) {
    const int64_t end = std::clamp<int64_t>(sh.end_key(i) - j0, 0, cols);
    return {std::clamp<int64_t>(sh.first_key(i) - j0, 0, end), end};
}

// The first key tile that query tile [i0, …) needs: the one holding its first row's first key.
inline int64_t first_key_tile(int64_t i0, const AttentionShape& sh) {
    return sh.first_key(i0) / kKeyTile * kKeyTile;
}

const FastRounder kE4M3Saturating(MiniFormat::e4m3, Overflow::saturate);

// z = cap(s), rounded to E4M3 (saturating at ±448) when the logits are FP8 (float32 only: the
// op refuses fp8_logits for float64, which instantiates the same code).
template <class T, bool kCapped, bool kFp8>
inline T capped(T s, T cap) {
    T z = s;
    if constexpr (kCapped) z = cap * math::tanh_fast(s / cap);
    if constexpr (kFp8) z = static_cast<T>(kE4M3Saturating(static_cast<float>(z)));
    return z;
}

template <class T>
constexpr T kE4M3Max = T(448);

// ---- forward ---------------------------------------------------------------------------------

// The online softmax of one query row: running max m, l = Σ exp(z − m), w = Σ exp(z − m)·z.
template <class T>
struct RowState {
    T m = -kInf<T>, l = 0, w = 0, max_abs_s = 0, saturated = 0;
};

// One row of one key tile. row: (cols), the raw dots r on entry, the unnormalised probabilities
// e = exp(z − m_new) on return (0 outside the visible span). Returns α = exp(m_old − m_new), the
// factor by which the row's output accumulator must be rescaled.
template <class T, bool kCapped, bool kFp8, bool kSignals>
T online_softmax_row(T* row, TileSpan span, int64_t cols, T g, T cap, RowState<T>& st) {
    const int64_t first = span.first, nv = span.end, n = nv - first;
    T* z = row + first;  // the dots r on entry, then z, then e, in place
    std::fill(row, z, T(0));
    // max |s| and w feed the stability signals only: a step that does not record them skips
    // both (a pass and a product per logit, a fifth of the forward's time at D = 32).
    if constexpr (kSignals)
        st.max_abs_s = std::max(
            st.max_abs_s, math::lane_max<T>(n, [=](int64_t j) { return std::abs(g * z[j]); }));
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) z[j] = capped<T, kCapped, kFp8>(g * z[j], cap);  // (z̃: FP8)
    if constexpr (kFp8)
        st.saturated += math::lane_sum<T>(
            n, [=](int64_t j) { return std::abs(z[j]) >= kE4M3Max<T> ? T(1) : T(0); });
    const T m_new = std::max(st.m, math::lane_max<T>(n, [=](int64_t j) { return z[j]; }));
    // Nothing finite seen yet (m_new = −inf): exponents taken relative to 0 give e = 0, not NaN.
    const T m_ref = m_new == -kInf<T> ? T(0) : m_new;
    const T alpha = math::exp_fast(st.m - m_ref);
    st.m = m_new;
    // Plain loops, so that exp vectorises; then the row sums (fixed order) over stored terms.
    if constexpr (kSignals) {
        T ez[kKeyTile];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
            const T e = math::exp_fast(z[j] - m_ref);
            ez[j] = e > T(0) ? e * z[j] : T(0);  // a z = −inf has e = 0 and adds nothing (not NaN)
            z[j] = e;
        }
        st.w = st.w * alpha + math::lane_sum<T>(n, [&](int64_t j) { return ez[j]; });
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) z[j] = math::exp_fast(z[j] - m_ref);
    }
    st.l = st.l * alpha + math::lane_sum<T>(n, [=](int64_t j) { return z[j]; });
    std::fill(row + nv, row + cols, T(0));
    return alpha;
}

template <class T>
struct ForwardArgs {
    T* out;
    double* lse;
    T *max_abs_s, *entropy, *saturated;
    const T *q, *k_t, *v, *scale;  // k_t: the keys transposed, (kv heads, D, Tk)
    int64_t scale_stride;
    T cap;
    AttentionShape shape;
};

// Per-thread buffers of the forward: one block of logits and the query tile's output accumulator.
template <class T>
struct ForwardScratch {
    std::vector<T> block, out_acc;
    std::vector<RowState<T>> rows;
    explicit ForwardScratch(int64_t D)
        : block(kQueryTile * kKeyTile), out_acc(kQueryTile * D), rows(kQueryTile) {}
};

// Writes the finished rows: O = O_acc / l, lse = m + log l, entropy = lse − w / l.
template <class T>
void finish_query_tile(const ForwardArgs<T>& a, ForwardScratch<T>& sc, int64_t bh, int64_t i0,
                       int64_t rows) {
    const int64_t D = a.shape.D, first_row = bh * a.shape.Tq + i0;
    for (int64_t r = 0; r < rows; ++r) {
        const RowState<T>& st = sc.rows[r];
        T* out = a.out + (first_row + r) * D;
        const T* acc = sc.out_acc.data() + r * D;
        // l = 0: no key with a finite logit (only with infinite inputs): output 0, lse −inf.
        const T inv_l = st.l > T(0) ? T(1) / st.l : T(0);
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) out[d] = acc[d] * inv_l;
        const double lse = st.l > T(0) ? double(st.m) + std::log(double(st.l))
                                       : (std::isnan(st.l) ? double(st.l) : -kInf<double>);
        a.lse[first_row + r] = lse;
        if (a.max_abs_s) {  // a NaN logit makes l NaN: both signals report it
            const bool nan_row = std::isnan(st.l);
            a.max_abs_s[first_row + r] = nan_row ? st.l : st.max_abs_s;
            a.entropy[first_row + r] =
                st.l > T(0) ? T(lse - double(st.w) / double(st.l)) : (nan_row ? st.l : T(0));
        }
        if (a.saturated) a.saturated[first_row + r] = st.saturated;
    }
}

template <class T, bool kCapped, bool kFp8, bool kSignals>
void forward_query_tile(const ForwardArgs<T>& a, ForwardScratch<T>& sc, int64_t bh, int64_t i0) {
    const AttentionShape& sh = a.shape;
    const int64_t D = sh.D, rows = std::min(kQueryTile, sh.Tq - i0);
    const T* q = a.q + (bh * sh.Tq + i0) * D;
    const T* k_t = a.k_t + sh.kv_head(bh) * D * sh.Tk;
    const T* v = a.v + sh.kv_head(bh) * sh.Tk * D;
    const T g = a.scale[(bh % sh.heads) * a.scale_stride];
    const int64_t last_key = sh.end_key(i0 + rows - 1);  // the tile's last row sees most
    std::fill(sc.rows.begin(), sc.rows.end(), RowState<T>{});
    std::fill(sc.out_acc.begin(), sc.out_acc.end(), T(0));
    T* block = sc.block.data();
    for (int64_t j0 = first_key_tile(i0, sh); j0 < last_key; j0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, last_key - j0);
        tile_gemm<T>(block, kKeyTile, q, false, D, k_t + j0, false, sh.Tk, rows, cols, D,
                     T(0));  // R
        for (int64_t r = 0; r < rows; ++r) {
            const T alpha = online_softmax_row<T, kCapped, kFp8, kSignals>(
                block + r * kKeyTile, visible_in_tile(i0 + r, j0, cols, sh), cols, g, a.cap,
                sc.rows[r]);
            if (alpha != T(1)) {
                T* acc = sc.out_acc.data() + r * D;
#pragma omp simd
                for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
            }
        }
        tile_gemm<T>(sc.out_acc.data(), D, block, false, kKeyTile, v + j0 * D, false, D, rows, D,
                     cols, T(1));  // O_acc += P V_j
    }
    finish_query_tile(a, sc, bh, i0, rows);
}

// ---- backward --------------------------------------------------------------------------------

template <class T>
struct BackwardArgs {
    T *dq, *dk, *dv, *dscale, *delta;
    const T *dout, *q, *k, *out;
    const T *k_t, *v_t;  // k and v transposed, (kv heads, D, Tk)
    const double* lse;
    const T* scale;
    int64_t scale_stride;
    T cap;
    AttentionShape shape;
};

// Per-thread buffers of the backward: the blocks R (then dR), P, dP and F.
template <class T>
struct BackwardScratch {
    std::vector<T> dots, probs, dprobs, cap_factor;
    BackwardScratch()
        : dots(kQueryTile * kKeyTile),
          probs(kQueryTile * kKeyTile),
          dprobs(kQueryTile * kKeyTile),
          cap_factor(kQueryTile * kKeyTile) {}
};

// One row of a block. r: (cols) the raw dots; p out: P = exp(z − lse) (0 where masked or where the
// row has no finite logit); f out: F = 1 − (z/c)² when capped. lse is split into lse_hi + lse_lo
// (T each), so that z − lse keeps the float64 lse's precision in T arithmetic: z − lse_hi is exact
// where it matters (z near lse, the large p).
template <class T, bool kCapped, bool kFp8>
void recompute_probs_row(T* p, T* f, const T* r, TileSpan span, int64_t cols, T g, T cap,
                         double lse) {
    const int64_t first = span.first, nv = lse == -kInf<double> ? first : span.end;
    std::fill(p, p + first, T(0));
    const T lse_hi = T(lse), lse_lo = T(lse - double(lse_hi));
#pragma omp simd
    for (int64_t j = first; j < nv; ++j) {
        const T z = capped<T, kCapped, false>(g * r[j], cap);
        const T z_used = kFp8 ? capped<T, false, kFp8>(z, cap) : z;         // z̃, as the forward's
        p[j] = std::min(T(1), math::exp_fast((z_used - lse_hi) - lse_lo));  // see ops/attention.cpp
        // F of the unrounded z: the rounding counts as the identity (straight-through).
        if constexpr (kCapped) f[j] = T(1) - (z / cap) * (z / cap);
    }
    std::fill(p + nv, p + cols, T(0));
}

// One row of a block: dS = P ∘ (dP − D) ∘ F, written over dP.
template <class T, bool kCapped, bool kFp8>
void logit_grad_row(T* dp, const T* p, const T* f, int64_t cols, T delta) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
        T ds = p[j] * (dp[j] - delta);
        if constexpr (kCapped) ds *= f[j];
        dp[j] = p[j] == T(0) ? T(0) : ds;  // masked: 0 even where dP is not finite
    }
}

// The blocks of key tile j0 against query tile i0 of head bh: adds into dk, dv, and into dq
// without the factor g (dq' = Σ_j dS_ij k_j; backward_query_head applies g and takes dg from it).
template <class T, bool kCapped, bool kFp8>
void backward_block(const BackwardArgs<T>& a, BackwardScratch<T>& sc, int64_t bh, int64_t i0,
                    int64_t j0) {
    const AttentionShape& sh = a.shape;
    const int64_t D = sh.D, rows = std::min(kQueryTile, sh.Tq - i0);
    const int64_t cols = std::min(kKeyTile, sh.Tk - j0), ld = kKeyTile;
    const int64_t q_off = (bh * sh.Tq + i0) * D, k_off = (sh.kv_head(bh) * sh.Tk + j0) * D;
    const T *q = a.q + q_off, *dout = a.dout + q_off, *k = a.k + k_off;
    const int64_t kt_off = sh.kv_head(bh) * D * sh.Tk + j0;  // column j0 of the head's Kᵀ, Vᵀ
    const T *k_t = a.k_t + kt_off, *v_t = a.v_t + kt_off;
    const T g = a.scale[(bh % sh.heads) * a.scale_stride];
    T *dots = sc.dots.data(), *probs = sc.probs.data(), *dprobs = sc.dprobs.data();
    T* cap_factor = sc.cap_factor.data();
    tile_gemm<T>(dots, ld, q, false, D, k_t, false, sh.Tk, rows, cols, D, T(0));  // R = Q_i K_jᵀ
    for (int64_t r = 0; r < rows; ++r)
        recompute_probs_row<T, kCapped, kFp8>(probs + r * ld, cap_factor + r * ld, dots + r * ld,
                                              visible_in_tile(i0 + r, j0, cols, sh), cols, g, a.cap,
                                              a.lse[bh * sh.Tq + i0 + r]);
    tile_gemm<T>(a.dv + k_off, D, probs, true, ld, dout, false, D, cols, D, rows, T(1));  // dV_j
    tile_gemm<T>(dprobs, ld, dout, false, D, v_t, false, sh.Tk, rows, cols, D,
                 T(0));  // dP = dO_i V_jᵀ
    for (int64_t r = 0; r < rows; ++r)
        logit_grad_row<T, kCapped, kFp8>(dprobs + r * ld, probs + r * ld, cap_factor + r * ld, cols,
                                         a.delta[bh * sh.Tq + i0 + r]);
    tile_gemm<T>(a.dq + q_off, D, dprobs, false, ld, k, false, D, rows, D, cols, T(1));    // dQ'_i
    tile_gemm<T>(a.dk + k_off, D, dprobs, true, ld, q, false, D, cols, D, rows, T(1), g);  // dK_j
}

// The query rows that see some key of the tile [j0, j0 + cols): [first, end).
struct RowSpan {
    int64_t first, end;
};
inline RowSpan rows_seeing(int64_t j0, int64_t cols, const AttentionShape& sh) {
    const int64_t shift = sh.Tk - sh.Tq;  // row i's last key is i + shift under the mask
    const int64_t first = sh.causal ? std::max<int64_t>(0, j0 - shift) : 0;
    // With a window, row i sees key j only while i + shift − window < j.
    const int64_t end = sh.window > 0
                            ? std::clamp<int64_t>(j0 + cols - 1 + sh.window - shift, first, sh.Tq)
                            : sh.Tq;
    return {first, end};
}

// Every block of query head bh, key tile by key tile: its dq is written, and its share added into
// the dk and dv of its key/value head.
template <class T, bool kCapped, bool kFp8>
void backward_query_head(const BackwardArgs<T>& a, BackwardScratch<T>& sc, int64_t bh) {
    const AttentionShape& sh = a.shape;
    const int64_t D = sh.D;
    for (int64_t i = 0; i < sh.Tq; ++i) {  // D_i = dO_i · O_i
        const T *dout = a.dout + (bh * sh.Tq + i) * D, *out = a.out + (bh * sh.Tq + i) * D;
        a.delta[bh * sh.Tq + i] = math::lane_sum<T>(D, [&](int64_t d) { return dout[d] * out[d]; });
    }
    std::fill(a.dq + bh * sh.Tq * D, a.dq + (bh + 1) * sh.Tq * D, T(0));
    for (int64_t j0 = 0; j0 < sh.Tk; j0 += kKeyTile) {
        const RowSpan span = rows_seeing(j0, std::min(kKeyTile, sh.Tk - j0), sh);
        for (int64_t i0 = span.first; i0 < span.end; i0 += kQueryTile)
            backward_block<T, kCapped, kFp8>(a, sc, bh, i0, j0);
    }
    // dg = Σ_ij dS_ij r_ij = Σ_i q_i · dq'_i (rows summed in double), then dq = g · dq'.
    const T g = a.scale[(bh % sh.heads) * a.scale_stride];
    T* dq = a.dq + bh * sh.Tq * D;
    const T* q = a.q + bh * sh.Tq * D;
    double dg = 0;
    for (int64_t i = 0; i < sh.Tq; ++i) {
        dg += math::lane_sum<T>(D, [&](int64_t d) { return q[i * D + d] * dq[i * D + d]; });
    }
    for (int64_t n = 0; n < sh.Tq * D; ++n) dq[n] *= g;
    if (a.dscale) a.dscale[bh] = T(dg);
}

// Key/value head kvh: its dk and dv zeroed, then every query head that reads it, in order.
template <class T, bool kCapped, bool kFp8>
void backward_kv_head(const BackwardArgs<T>& a, BackwardScratch<T>& sc, int64_t kvh) {
    const AttentionShape& sh = a.shape;
    const int64_t D = sh.D, group = sh.heads / sh.kv_heads;
    std::fill(a.dk + kvh * sh.Tk * D, a.dk + (kvh + 1) * sh.Tk * D, T(0));
    std::fill(a.dv + kvh * sh.Tk * D, a.dv + (kvh + 1) * sh.Tk * D, T(0));
    const int64_t first_bh = (kvh / sh.kv_heads) * sh.heads + (kvh % sh.kv_heads) * group;
    for (int64_t bh = first_bh; bh < first_bh + group; ++bh)
        backward_query_head<T, kCapped, kFp8>(a, sc, bh);
}

// Calls f(capped, fp8) with the two switches of the logit z as compile-time constants
// (std::bool_constant), so that the row loops carry no branch for them.
template <class T, class F>
void with_logit_kind(T cap, const AttentionShape& shape, F&& f) {
    using Yes = std::true_type;
    using No = std::false_type;
    if (cap > 0)
        shape.fp8_logits ? f(Yes{}, Yes{}) : f(Yes{}, No{});
    else
        shape.fp8_logits ? f(No{}, Yes{}) : f(No{}, No{});
}

}  // namespace

template <class T>
void attention_forward(T* out, double* lse, T* max_abs_s, T* entropy, T* saturated, const T* q,
                       const T* k, const T* v, const T* scale, int64_t scale_stride, T cap,
                       const AttentionShape& shape) {
    const int64_t kv_heads = shape.batch_heads / shape.heads * shape.kv_heads;
    const std::vector<T> k_t = transpose_heads(k, kv_heads, shape.Tk, shape.D);
    const ForwardArgs<T> args{out,        lse, max_abs_s, entropy,      saturated, q,
                              k_t.data(), v,   scale,     scale_stride, cap,       shape};
    const int64_t tiles = (shape.Tq + kQueryTile - 1) / kQueryTile;
    auto range = [&](int64_t begin, int64_t end) {
        ForwardScratch<T> scratch(shape.D);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / tiles, i0 = (task % tiles) * kQueryTile;
            with_logit_kind<T>(cap, shape, [&](auto capped, auto fp8) {
                if (max_abs_s)
                    forward_query_tile<T, capped(), fp8(), true>(args, scratch, bh, i0);
                else
                    forward_query_tile<T, capped(), fp8(), false>(args, scratch, bh, i0);
            });
        }
    };
    parallel_for(shape.batch_heads * tiles, range);
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* dscale, T* delta, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const double* lse, const T* scale,
                        int64_t scale_stride, T cap, const AttentionShape& shape) {
    const int64_t kv_heads = shape.batch_heads / shape.heads * shape.kv_heads;
    const std::vector<T> k_t = transpose_heads(k, kv_heads, shape.Tk, shape.D);
    const std::vector<T> v_t = transpose_heads(v, kv_heads, shape.Tk, shape.D);
    const BackwardArgs<T> args{dq,  dk,   dv,         dscale,     delta, dout,  q,
                               k,   out,  k_t.data(), v_t.data(), lse,   scale, scale_stride,
                               cap, shape};
    auto range = [&](int64_t begin, int64_t end) {
        BackwardScratch<T> scratch;
        for (int64_t kvh = begin; kvh < end; ++kvh) {
            with_logit_kind<T>(cap, shape, [&](auto capped, auto fp8) {
                backward_kv_head<T, capped(), fp8()>(args, scratch, kvh);
            });
        }
    };
    parallel_for(shape.batch_heads / shape.heads * shape.kv_heads, range);
}

template void attention_forward<float>(float*, double*, float*, float*, float*, const float*,
                                       const float*, const float*, const float*, int64_t, float,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, double*, double*, double*, const double*,
                                        const double*, const double*, const double*, int64_t,
                                        double, const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, float*, float*, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const double*, const float*, int64_t, float,
                                        const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, double*, double*, const double*,
                                         const double*, const double*, const double*, const double*,
                                         const double*, const double*, int64_t, double,
                                         const AttentionShape&);

}  // namespace qk::cpu
