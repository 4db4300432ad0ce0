// Softmax and log-softmax over the last dim, with the attention soft-cap and causal mask fused in:
// one task per row, which reads the row from memory once and writes it once (its later passes
// over the row hit the cache).
//
// Forward, per row x of length Tk (the input seen as (rows, Tk); for the causal mask the row is
// query i = row mod Tq of the last two dims (..., Tq, Tk)):
//   z_j = c · tanh(x_j / c)        soft-cap, when c > 0 (else z = x)
//   visible j:  j <= i + (Tk − Tq) when causal (the last query sees every key), else every j
//   m = max_vis z,  S = Σ_vis exp(z_j − m),  lse = m + log S      (every exp(z − m) <= 1)
//   softmax:      y_j = exp(z_j − m) / S       masked j: y_j = 0 exactly
//   log_softmax:  y_j = z_j − lse              masked j: y_j = −inf
// A row with nothing finite to see (every visible z = −inf) has no distribution: we define its
// softmax as 0, its log_softmax as −inf and its gradient as 0 (never NaN). A row with a NaN (or
// +inf, where z − m is NaN) among its visible logits is NaN at every visible position, and so is
// its lse and its gradient: a NaN in the weights must reach the loss, never be masked into a
// finite distribution. Causal with Tq > Tk would leave the first rows with no key at all and is
// rejected.
//
// Saved: y, and lse per row (rows values, negligible next to y). In attention y is kept anyway by
// the next op (y @ v saves y for its backward), so saving it here shares that storage.
//
// Backward, per row, g = dy over the visible entries (masked outputs are constants):
//   softmax:      ∂y_k/∂z_j = y_k (δ_kj − y_j)
//                 dz_j = Σ_k g_k y_k (δ_kj − y_j) = y_j (g_j − dot),     dot = Σ_k g_k y_k
//   log_softmax:  ∂y_k/∂z_j = δ_kj − p_j,  p_j = exp(y_j)
//                 dz_j = g_j − p_j · sum_dy,                           sum_dy = Σ_k g_k
//   soft-cap:     dx_j = dz_j · cap_factor_j,   cap_factor_j = 1 − tanh²(x_j/c) = 1 − (z_j/c)²
//   masked j:     dx_j = 0
// The soft-cap's backward needs z, which we recompute from what is saved rather than save it:
//   log_softmax:  z_j = y_j + lse                  (free)
//   softmax:      z_j = log(y_j) + lse  where y_j > 0; where y_j = 0 (masked, or exp underflow)
//                 dz_j = y_j (...) = 0 and the factor is not needed.
// Saving z instead would keep a second (rows, Tk) tensor alive until backward, the size of the
// attention matrix (T² per head per layer, the largest activation); recomputing costs one log per
// element in the softmax backward only.
//
// The naive reference (v1: the same math from composite ops max, exp, sum) lives next to the
// tests in tests/test_softmax.cpp; this file holds the fused v2, faster because it reads x and
// writes y once per row (v1 materialises z, z − m, exp and the sums as separate tensors).
// The CUDA twin, cuda/softmax.cu, runs the same math with one warp per row.
#include "ops/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/elementwise_math.h"  // math::exp_fast, math::tanh_fast
#include "ops/lane_sum.h"
#include "ops/on_device.h"
#include "ops/rounded_copy.h"

namespace qk {

namespace cpu {

// Speed: every loop over a row vectorises (exp and the cap's tanh are math::exp_fast and
// math::tanh_fast, polynomials, because glibc's expf and tanhf are scalar calls that would stop the
// loop from vectorising; the softmax cap backward's log remains a scalar call). Sums accumulate in
// T in math::lane_sum's 16 interleaved partial sums (ops/lane_sum.h), which held a float32 softmax
// over 50257 logits to 7e-6 relative of float64 (most of it the rounding of the input) in every
// build type; double accumulators cost ~25 % here.

// Keys row `r` may see: all Tk, or the causal prefix up to i + (Tk − Tq), i = r mod Tq.
inline int64_t visible_keys(int64_t r, int64_t Tq, int64_t Tk, bool causal) {
    return causal ? std::min(Tk, r % Tq + (Tk - Tq) + 1) : Tk;
}

// Rows below this many elements in total run on one thread: waking the pool costs more.
constexpr int64_t kParallelWork = 1 << 15;

// The causal mask as data: keep = (1 × Tk, 0 × Tk), and the row with n visible keys reads
// keep + (Tk − n), which is 1 for j < n and 0 after. Every loop then runs over the whole row with
// a select on keep[j] instead of stopping at the row's ragged n: GCC ends such a loop (and splits
// a select on j < n into one) with a scalar epilogue per loop, which made causal rows at T = 64
// 1.8x slower than full ones despite half the work (now ~1.4x: the select costs a little).
// Non-causal rows use the kCausal = false instantiation, with no keep.
template <class T>
std::vector<T> causal_keep(int64_t Tk) {
    std::vector<T> keep(2 * Tk, T(0));
    std::fill(keep.begin(), keep.begin() + Tk, T(1));
    return keep;
}

// A row with a NaN or +inf among its n visible logits: NaN where visible (masked entries keep
// their 0 or −inf from the caller's pass, or are set here), and a NaN lse.
template <class T, bool kLog>
T nan_row_impl(T* y, int64_t n, int64_t Tk) {
    std::fill(y, y + n, std::numeric_limits<T>::quiet_NaN());
    std::fill(y + n, y + Tk, kLog ? -std::numeric_limits<T>::infinity() : T(0));
    return std::numeric_limits<T>::quiet_NaN();
}

// One row. y: (Tk) out; returns lse; x: (Tk); keep: (Tk), 1 where visible (kCausal only); the first
// n keys are the visible ones. cap: 0 = none.
template <class T, bool kLog, bool kCausal>
T softmax_row_forward(T* y, const T* x, const T* keep, int64_t n, int64_t Tk, T cap) {
    constexpr T inf = std::numeric_limits<T>::infinity();
    const T* z = x;  // z: the capped logits, staged in y so that tanh runs once per element
    if (cap > 0) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) y[j] = cap * math::tanh_fast(x[j] / cap);
        z = y;
    }
    auto visible_z = [&](int64_t j) { return !kCausal || keep[j] != T(0) ? z[j] : -inf; };
    auto nan_row = [&](T* row, int64_t visible) { return nan_row_impl<T, kLog>(row, visible, Tk); };
    T m = -inf;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < Tk; ++j) m = std::max(m, visible_z(j));
    if (m == -inf) {  // nothing finite visible, or only NaN (the max skips NaN): see the header
        std::fill(y, y + Tk, kLog ? -inf : T(0));
        for (int64_t j = 0; j < n; ++j)
            if (std::isnan(z[j])) return nan_row(y, n);
        return -inf;
    }
    // Masked entries come out of the same loops: exp(−inf − m) = 0, and −inf − lse = −inf.
    if constexpr (kLog) {
        const T S =
            math::lane_sum<T>(Tk, [&](int64_t j) { return math::exp_fast(visible_z(j) - m); });
        if (std::isnan(S)) return nan_row(y, n);  // a NaN or +inf visible logit
        const T lse = m + std::log(S);
#pragma omp simd
        for (int64_t j = 0; j < Tk; ++j) y[j] = visible_z(j) - lse;  // y = z − lse
        return lse;
    } else {
#pragma omp simd
        for (int64_t j = 0; j < Tk; ++j) y[j] = math::exp_fast(visible_z(j) - m);
        const T S = math::lane_sum<T>(Tk, [&](int64_t j) { return y[j]; });  // Σ exp(z − m)
        if (std::isnan(S)) return nan_row(y, n);  // a NaN or +inf visible logit
        const T inv_S = T(1) / S;
#pragma omp simd
        for (int64_t j = 0; j < Tk; ++j) y[j] *= inv_S;  // y = exp(z − m) / S
        return m + std::log(S);
    }
}

// y: (rows, Tk) out; lse: (rows) out; x: (rows, Tk). cap: soft-cap c, 0 for none.
// kLog selects log_softmax. Row r is query r mod Tq of a (..., Tq, Tk) causal mask.
template <class T, bool kLog>
void softmax_forward(T* y, T* lse, const T* x, int64_t rows, int64_t Tq, int64_t Tk, bool causal,
                     T cap) {
    const std::vector<T> keep = causal ? causal_keep<T>(Tk) : std::vector<T>{};
    auto range = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const int64_t n = visible_keys(r, Tq, Tk, causal);
            T* yr = y + r * Tk;
            const T* xr = x + r * Tk;
            lse[r] = causal ? softmax_row_forward<T, kLog, true>(yr, xr, keep.data() + (Tk - n), n,
                                                                 Tk, cap)
                            : softmax_row_forward<T, kLog, false>(yr, xr, nullptr, n, Tk, cap);
        }
    };
    parallel_for(rows, range, rows * Tk >= kParallelWork);
}

// One row. dx: (Tk) out; dy, y: (Tk); keep: as in the forward; lse: the row's lse.
template <class T, bool kLog, bool kCausal>
void softmax_row_backward(T* dx, const T* dy, const T* y, const T* keep, T lse, int64_t n,
                          int64_t Tk, T cap) {
    if (lse == -std::numeric_limits<T>::infinity()) {  // nothing finite visible: gradient 0
        std::fill(dx, dx + Tk, T(0));
        return;
    }
    if (std::isnan(lse)) {  // a NaN row: NaN gradient where visible, masked entries still 0
        std::fill(dx, dx + n, std::numeric_limits<T>::quiet_NaN());
        std::fill(dx + n, dx + Tk, T(0));
        return;
    }
    // g: dy on visible entries, 0 on masked ones (their outputs are constants). Masked dx then
    // come out as 0 from the same loops, since there y = 0 (softmax) or exp(y) = 0 (log).
    auto g = [&](int64_t j) { return !kCausal || keep[j] != T(0) ? dy[j] : T(0); };
    if constexpr (kLog) {
        const T sum_dy = math::lane_sum<T>(Tk, g);
#pragma omp simd
        for (int64_t j = 0; j < Tk; ++j) dx[j] = g(j) - math::exp_fast(y[j]) * sum_dy;  // dz
    } else {
        const T dot = math::lane_sum<T>(Tk, [&](int64_t j) { return g(j) * y[j]; });
#pragma omp simd
        for (int64_t j = 0; j < Tk; ++j) dx[j] = y[j] * (g(j) - dot);  // dz
    }
    if (cap > 0) {  // dx = dz · cap_factor, z recomputed from y and lse (see the header)
        const T inv_cap = T(1) / cap;
        for (int64_t j = 0; j < n; ++j) {
            if (!kLog && y[j] == T(0)) continue;                           // dz_j = 0 already
            const T t = ((kLog ? y[j] : std::log(y[j])) + lse) * inv_cap;  // z / c
            dx[j] *= T(1) - t * t;
        }
    }
}

// dx: (rows, Tk) out; dy, y: (rows, Tk); lse: (rows). Same row/mask layout as the forward.
template <class T, bool kLog>
void softmax_backward(T* dx, const T* dy, const T* y, const T* lse, int64_t rows, int64_t Tq,
                      int64_t Tk, bool causal, T cap) {
    const std::vector<T> keep = causal ? causal_keep<T>(Tk) : std::vector<T>{};
    auto range = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const int64_t n = visible_keys(r, Tq, Tk, causal), o = r * Tk;
            if (causal)
                softmax_row_backward<T, kLog, true>(dx + o, dy + o, y + o, keep.data() + (Tk - n),
                                                    lse[r], n, Tk, cap);
            else
                softmax_row_backward<T, kLog, false>(dx + o, dy + o, y + o, nullptr, lse[r], n, Tk,
                                                     cap);
        }
    };
    parallel_for(rows, range, rows * Tk >= kParallelWork);
}

// Declared in ops/softmax.h for the kernel-level tests of the CUDA twins.
template void softmax_forward<float, false>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                            bool, float);
template void softmax_forward<float, true>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                           bool, float);
template void softmax_forward<double, false>(double*, double*, const double*, int64_t, int64_t,
                                             int64_t, bool, double);
template void softmax_forward<double, true>(double*, double*, const double*, int64_t, int64_t,
                                            int64_t, bool, double);
template void softmax_backward<float, false>(float*, const float*, const float*, const float*,
                                             int64_t, int64_t, int64_t, bool, float);
template void softmax_backward<float, true>(float*, const float*, const float*, const float*,
                                            int64_t, int64_t, int64_t, bool, float);
template void softmax_backward<double, false>(double*, const double*, const double*, const double*,
                                              int64_t, int64_t, int64_t, bool, double);
template void softmax_backward<double, true>(double*, const double*, const double*, const double*,
                                             int64_t, int64_t, int64_t, bool, double);

}  // namespace cpu

namespace {

using autograd::Grads;

// The (rows, Tq, Tk) geometry of a softmax over the last dim; Tq matters only for the mask.
struct RowShape {
    int64_t rows, Tq, Tk;
};

RowShape check_softmax_args(const char* op, const Tensor& x, const SoftmaxOptions& o) {
    QK_CHECK(is_compute_dtype(x.dtype()),
             "{}: needs a float32 or float64 tensor, got {} of shape {}", op, x.dtype(), x.shape());
    QK_CHECK(x.dim() >= 1, "{}: needs at least one dim (it normalises the last), got shape {}", op,
             x.shape());
    QK_CHECK(o.softcap >= 0 && std::isfinite(o.softcap),
             "{}: softcap must be a finite number >= 0 (0 = off), got {} (input shape {})", op,
             o.softcap, x.shape());
    const int64_t Tk = x.size(-1);
    const int64_t Tq = x.dim() >= 2 ? x.size(-2) : 1;
    if (o.causal) {
        QK_CHECK(x.dim() >= 2,
                 "{}: causal mask needs the last two dims (..., Tq, Tk), got shape {}", op,
                 x.shape());
        QK_CHECK(Tq <= Tk,
                 "{}: causal mask needs Tq <= Tk, got shape {} (Tq = {}, Tk = {}): the first {} "
                 "query rows would see no key",
                 op, x.shape(), Tq, Tk, Tq - Tk);
    }
    return {Tk > 0 ? x.numel() / Tk : 0, Tq, Tk};
}

template <bool kLog>
Tensor softmax_impl(const char* op, const Tensor& x_in, const SoftmaxOptions& o) {
    const RowShape rs = check_softmax_args(op, x_in, o);
    const Tensor x = autograd::contiguous_input(x_in);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    Shape lse_shape = x.shape();
    lse_shape.pop_back();
    Tensor lse = Tensor::empty(lse_shape, x.dtype(), x.device());
    const Tensor y_half = rounded_copy_for(y, o.rounded_copy);
    const bool bf16_copy = o.rounded_copy == Precision::bf16;
    on_device(
        op, x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::softmax_forward<T, kLog>(y.data<T>(), lse.data<T>(), x.data<T>(), rs.rows, rs.Tq,
                                          rs.Tk, o.causal, T(o.softcap));
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::softmax_forward<T>(y.data<T>(), lse.data<T>(), x.data<T>(), rs.rows, rs.Tq, rs.Tk,
                                     o.causal, T(o.softcap), kLog, half_bits(y_half), bf16_copy);
        });
    keep_rounded_copy(y, y_half);
    auto backward = [op, rs, o, bf16_copy, y = autograd::saved(y),
                     lse = autograd::saved(lse)](const Tensor& dy_in) {
        Tensor dy = dy_in.contiguous();
        Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
        const Tensor dx_half = rounded_copy_for(dx, o.rounded_copy);
        on_device(
            op, y.device(), y.dtype(),
            [&](auto tag) {
                using T = decltype(tag);
                cpu::softmax_backward<T, kLog>(dx.data<T>(), dy.data<T>(), y.data<T>(),
                                               lse.data<T>(), rs.rows, rs.Tq, rs.Tk, o.causal,
                                               T(o.softcap));
            },
            [&](auto tag) {
                using T = decltype(tag);
                cuda::softmax_backward<T>(dx.data<T>(), dy.data<T>(), y.data<T>(), lse.data<T>(),
                                          rs.rows, rs.Tq, rs.Tk, o.causal, T(o.softcap), kLog,
                                          half_bits(dx_half), bf16_copy);
            });
        keep_rounded_copy(dx, dx_half);
        return Grads{dx};
    };
    return autograd::record(op, y, {x_in}, std::move(backward));
}

}  // namespace

Tensor softmax(const Tensor& x, const SoftmaxOptions& options) {
    return softmax_impl<false>("softmax", x, options);
}

Tensor log_softmax(const Tensor& x, const SoftmaxOptions& options) {
    return softmax_impl<true>("log_softmax", x, options);
}

}  // namespace qk
