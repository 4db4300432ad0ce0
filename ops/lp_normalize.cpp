// lp_normalize: x / ‖x‖_p along any dim, the normalisation of the Lp QK-norm (Lopez-Rubio et
// al.). Part of the normalisation family of ops/norm.cpp, whose header explains the kernel ladder
// (v1 the formulas, v2 vectorised with 16-lane row sums and the thread pool over rows).
//
// lp_normalize n = ‖x‖_p = (Σ|x|^p)^(1/p)    d = max(n, eps)    y = x / d        (p >= 1)
//   saves      x, n (rows)
//   backward   ∂n/∂x_i = sign(x_i)|x_i|^(p-1) / n^(p-1) = sign(y_i)|y_i|^(p-1) =: g_i  (n > eps)
//                  dx = dy / n  -  (Σ_j dy_j x_j) / n² · g   =  ( dy  -  (Σ_j dy_j y_j) · g ) / n
//                                                                direct    norm term
//              When n <= eps the denominator is the constant eps: dx = dy / eps, no norm term.
//              At p = 1, |x| has a kink at 0; we use the subgradient sign(x) with sign(0) = 0.
//
// v2 takes |x|^p by multiplication for integer p (std::pow is a scalar libm call) and scales each
// row by 1/max|x| before raising it to p, so that |x|^p can neither overflow nor underflow.
#include "ops/norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/lane_sum.h"
#include "ops/norm_common.h"
#include "ops/on_device.h"

namespace qk {

namespace cpu {

// ---- v1: the formulas, plain loops, one thread -----------------------------------------------

template <class T>
void lp_normalize_forward_v1(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p, T eps) {
    for (int64_t r = 0; r < rows; ++r) {
        T sum = 0;
        for (int64_t c = 0; c < C; ++c) sum += std::pow(std::abs(x[r * C + c]), p);
        norm[r] = std::pow(sum, T(1) / p);
        for (int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] / std::max(norm[r], eps);
    }
}

template <class T>
void lp_normalize_backward_v1(T* dx, const T* dy, const T* x, const T* norm, int64_t rows,
                              int64_t C, T p, T eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r * C;
        const T n = norm[r];
        T dy_dot_x = 0;
        for (int64_t c = 0; c < C; ++c) dy_dot_x += dy[o + c] * x[o + c];
        for (int64_t c = 0; c < C; ++c) {
            const T sign = T((x[o + c] > 0) - (x[o + c] < 0));
            const T dn_dx = sign * std::pow(std::abs(x[o + c]), p - 1) / std::pow(n, p - 1);
            dx[o + c] = dy[o + c] / std::max(n, eps) - (n > eps ? dy_dot_x / (n * n) * dn_dx : 0);
        }
    }
}

// ---- v2: one read of each input row, vectorised, threads over rows ---------------------------

// Integer p in 3..8 takes |a|^p by multiplication, which vectorises where std::pow (a scalar libm
// call) runs ~20x slower. K is a compile-time constant so that int_pow is straight-line code: with
// a run-time k the row loops did not vectorise (3x slower).
template <int K, class T>
inline T int_pow(T a) {
    T r = a;
    for (int i = 1; i < K; ++i) r *= a;  // constant trip count: fully unrolled
    return r;
}

// Calls f(std::integral_constant<int, K>{}) with K = p if p is an integer in 3..8 (trying K = 3,
// 4, ... in turn); returns whether it did.
template <int K = 3, class F>
bool with_small_int_power(double p, F&& f) {
    if constexpr (K > 8) {
        return false;
    } else {
        if (p != K) return with_small_int_power<K + 1>(p, f);
        f(std::integral_constant<int, K>{});
        return true;
    }
}

// Σ_c pw(|x_c| · inv_m) over one row.
template <class T, class Pow>
T scaled_power_sum(const T* xr, int64_t C, T inv_m, Pow pw) {
    return math::lane_sum<T>(C, [=](int64_t c) { return pw(std::abs(xr[c]) * inv_m); });
}

// ‖x‖_p of one row. For p != 1 the row is first scaled by 1/max|x| (an extra pass over L1), so
// that |x|^p neither overflows (float32: |x| > 1.8e19 at p = 2, far less at p = 4) nor flushes to
// zero for tiny x: every scaled |x| is <= 1 and the largest is exactly 1.
template <class T>
T lp_norm_of_row(const T* xr, int64_t C, T p) {
    if (p == T(1)) return scaled_power_sum(xr, C, T(1), [](T a) { return a; });
    T m = 0;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < C; ++c) m = std::max(m, std::abs(xr[c]));
    if (!(m > 0)) return m;  // all-zero row (or NaN in x, which propagates)
    const T inv_m = T(1) / m;
    if (p == T(2)) return m * std::sqrt(scaled_power_sum(xr, C, inv_m, [](T a) { return a * a; }));
    T sum = 0;
    const bool integer_p = with_small_int_power(p, [&](auto K) {
        constexpr int k = decltype(K)::value;
        sum = scaled_power_sum(xr, C, inv_m, [](T a) { return int_pow<k>(a); });
    });
    if (!integer_p) sum = scaled_power_sum(xr, C, inv_m, [p](T a) { return std::pow(a, p); });
    return m * std::pow(sum, T(1) / p);
}

template <class T>
void lp_normalize_forward(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p, T eps) {
    auto range = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T* xr = x + r * C;
            T* yr = y + r * C;
            const T n = lp_norm_of_row(xr, C, p);
            const T inv = T(1) / std::max(n, eps);
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * inv;
            norm[r] = n;
        }
    };
    parallel_for(rows, range, rows * C >= kNormParallelWork);
}

// dx = (dy - s · g(y)) · inv for one row, y = x · inv, g(y) = ∂n/∂x written through y.
template <class T, class G>
void lp_backward_row(T* dxr, const T* dyr, const T* xr, int64_t C, T inv, G g) {
    const T s = math::lane_sum<T>(C, [=](int64_t c) { return dyr[c] * (xr[c] * inv); });  // Σ dy·y
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dxr[c] = (dyr[c] - s * g(xr[c] * inv)) * inv;  // direct - norm
}

template <class T>
void lp_normalize_backward(T* dx, const T* dy, const T* x, const T* norm, int64_t rows, int64_t C,
                           T p, T eps) {
    auto range = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T *xr = x + r * C, *dyr = dy + r * C;
            T* dxr = dx + r * C;
            const T n = norm[r], inv = T(1) / std::max(n, eps);
            if (!(n > eps)) {  // clamped: y = x / eps, a constant denominator
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) dxr[c] = dyr[c] * inv;
            } else if (p == T(1)) {  // g = sign(y), sign(0) = 0: the subgradient at the kink
                lp_backward_row(dxr, dyr, xr, C, inv, [](T v) { return T((v > 0) - (v < 0)); });
            } else if (p == T(2)) {  // g = y
                lp_backward_row(dxr, dyr, xr, C, inv, [](T v) { return v; });
            } else {  // g = sign(y)|y|^(p-1): by products for integer p, else std::pow
                const bool integer_p = with_small_int_power(p, [&](auto K) {
                    constexpr int k = decltype(K)::value;
                    lp_backward_row(dxr, dyr, xr, C, inv, [](T v) {
                        return std::copysign(int_pow<k - 1>(std::abs(v)), v);
                    });
                });
                if (!integer_p)  // g is 0 at y = 0 since p > 1
                    lp_backward_row(dxr, dyr, xr, C, inv, [p](T v) {
                        return std::copysign(std::pow(std::abs(v), p - 1), v);
                    });
            }
        }
    };
    parallel_for(rows, range, rows * C >= kNormParallelWork);
}

QK_NORM_INSTANTIATE(lp_normalize_forward_v1)
QK_NORM_INSTANTIATE(lp_normalize_forward)
QK_NORM_INSTANTIATE(lp_normalize_backward_v1)
QK_NORM_INSTANTIATE(lp_normalize_backward)

}  // namespace cpu

using autograd::Grads;

Tensor lp_normalize(const Tensor& x_in, double p, int64_t dim, double eps) {
    check_norm_input("lp_normalize", x_in, eps);
    QK_CHECK(p >= 1 && std::isfinite(p),
             "lp_normalize: p must be finite and >= 1 (below 1 ‖x‖_p is not a norm), got {} for x "
             "of shape {}",
             p, x_in.shape());
    // The kernels normalise contiguous rows: swap `dim` to the end (a view), copy once, and swap
    // the result (and in the backward, dx) back. QK-norm uses dim = -1, which needs neither step.
    const int64_t d = normalize_dim(dim, x_in.dim(), "lp_normalize"), last = x_in.dim() - 1;
    // Transposed after saved(): a view of the caller's tensor would record a node only to drop it.
    const Tensor x =
        autograd::contiguous_input(d == last ? x_in : autograd::saved(x_in).transpose(d, last));
    const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
    Tensor y = empty_like(x), norm = Tensor::empty({rows}, x.dtype(), x.device());
    on_device(
        "lp_normalize", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::lp_normalize_forward(y.data<T>(), norm.data<T>(), x.data<T>(), rows, C, T(p),
                                      T(eps));
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::lp_normalize_forward(y.data<T>(), norm.data<T>(), x.data<T>(), rows, C, T(p),
                                       T(eps));
        });
    y = autograd::record(
        "lp_normalize", y, {x_in},
        [x = autograd::saved(x), norm = autograd::saved(norm), rows, C, p, eps, d,
         last](const Tensor& dy_in) {
            Tensor dy = dy_in.contiguous(), dx = empty_like(x);
            on_device(
                "lp_normalize backward", x.device(), x.dtype(),
                [&](auto tag) {
                    using T = decltype(tag);
                    cpu::lp_normalize_backward(dx.data<T>(), dy.data<T>(), x.data<T>(),
                                               norm.data<T>(), rows, C, T(p), T(eps));
                },
                [&](auto tag) {
                    using T = decltype(tag);
                    cuda::lp_normalize_backward(dx.data<T>(), dy.data<T>(), x.data<T>(),
                                                norm.data<T>(), rows, C, T(p), T(eps));
                });
            return Grads{d == last ? dx : dx.transpose(d, last)};
        });
    return d == last ? y : y.transpose(d, last);
}

}  // namespace qk
