// Reductions.
//
// sum:  y = Σ_{reduced dims} x            backward: dx = expand(dy)   (every x element fed y once)
// mean: y = sum(x) / N                    backward: dx = expand(dy) / N
// sum_to(x, shape) is sum over the dims that broadcasting from `shape` would create; its
// backward is expand(dy) back to x's shape.
//
// max:  y = max_{reduced dims} x          saves x, y
//       backward: dx_i = dy · [x_i == y] / k, k = number of elements tied at the max.
//       Tie rule (same as torch.amax): the gradient is split evenly among tied maxima, so that
//       the sum of dx over a reduced group is dy whatever the ties (the max of n copies of one
//       value moves by dy when all of them move together). NaN propagates: a group holding a NaN
//       has y = NaN, and no x equals NaN, so its dx is 0.
//
// var:  composite: μ = mean(x), d = x − μ, y = Σ d² / (N − correction). Two passes (centre,
//       then square) avoid the cancellation of E[x²] − E[x]²; the backward comes from the ops:
//       dx = 2 d / (N − c) · dy (the term through μ is Σ d = 0 and vanishes).
//
// logsumexp: m = max x (treated as a constant: lse does not depend on it),
//       y = lse = m + log Σ exp(x − m)    every exp(x − m) <= 1, so nothing overflows
//       saves x, lse
//       backward: dx_i = dy · exp(x_i − lse) = dy · softmax(x)_i
//       -inf: a group of all -inf has m = -inf; the shift is then taken as 0 (not -inf, which
//       would make -inf − (-inf) = NaN), Σ exp = 0, and lse = -inf. Its gradient is defined as 0.
//
// Kernels: the output is indexed with stride 0 along every reduced dim, so walking x once and
// doing out[off] ⊕= x[i] reduces without copying or permuting x. Output and saved per-group
// tensors use the keepdim layout ("kept": size 1 on reduced dims).
#include "ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/strided.h"
#include "core/threading.h"
#include "ops/elementwise.h"
#include "ops/elementwise_math.h"  // math::exp_fast, the vectorisable exp of the exp-sum kernels
#include "ops/on_device.h"

namespace qk {

namespace cpu {

// out: zero-initialised, read/written through out_strides (0 on reduced dims);
// x: shape `shape`, any strides.    out[reduce(i)] += x[i]
template <class T>
void sum_accumulate(T* out, const Shape& out_strides, const T* x, const Shape& x_strides,
                    const Shape& shape) {
    const int64_t so = shape.empty() ? 0 : out_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    for_each_run<2>(shape, {&out_strides, &x_strides}, [&](const auto& off, int64_t n) {
        T* o = out + off[0];
        const T* p = x + off[1];
        if (so == 0) {  // reducing along the run: a sum the compiler may vectorise
            T acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < n; ++i) acc += p[i * sx];
            o[0] += acc;
        } else if (sx == 1 && so == 1) {
            for (int64_t i = 0; i < n; ++i) o[i] += p[i];
        } else {
            for (int64_t i = 0; i < n; ++i) o[i * so] += p[i * sx];
        }
    });
}

// max that lets a NaN in and never lets it out again (plain std::max would drop NaNs).
template <class T>
T max_nan(T acc, T v) {
    return (v > acc || v != v) ? v : acc;
}

// y: initialised to -inf, read/written through y_strides (0 on reduced dims);
// x: shape `shape`, any strides.    y[reduce(i)] = max(y[reduce(i)], x[i])
template <class T>
void max_accumulate(T* y, const Shape& y_strides, const T* x, const Shape& x_strides,
                    const Shape& shape) {
    const int64_t sy = shape.empty() ? 0 : y_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    for_each_run<2>(shape, {&y_strides, &x_strides}, [&](const auto& off, int64_t n) {
        T* o = y + off[0];
        const T* p = x + off[1];
        for (int64_t i = 0; i < n; ++i) o[i * sy] = max_nan(o[i * sy], p[i * sx]);
    });
}

// count: zero-initialised, y: the max; both kept layout, read through k_strides (0 on reduced
// dims); x: shape `shape`, any strides.    count[r] = #{i in group r : x[i] == y[r]}
template <class T>
void max_count_ties(T* count, const T* y, const Shape& k_strides, const T* x,
                    const Shape& x_strides, const Shape& shape) {
    const int64_t sk = shape.empty() ? 0 : k_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    for_each_run<2>(shape, {&k_strides, &x_strides}, [&](const auto& off, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
            count[off[0] + i * sk] += x[off[1] + i * sx] == y[off[0] + i * sk] ? T(1) : T(0);
    });
}

// dx: shape `shape`, contiguous; x: any strides; y, dy, count: kept layout through k_strides.
//   dx[i] = [x[i] == y[r]] · dy[r] / count[r]      (the tie rule: split among the tied maxima)
template <class T>
void max_backward(T* dx, const T* x, const Shape& x_strides, const T* y, const T* dy,
                  const T* count, const Shape& k_strides, const Shape& shape) {
    const Shape dx_strides = contiguous_strides(shape);
    const int64_t sk = shape.empty() ? 0 : k_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    for_each_run<3>(shape, {&dx_strides, &x_strides, &k_strides}, [&](const auto& off, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
            const int64_t r = off[2] + i * sk;
            dx[off[0] + i] = x[off[1] + i * sx] == y[r] ? dy[r] / count[r] : T(0);
        }
    });
}

// The shift logsumexp subtracts: the group max, or 0 where that max is ±inf or NaN.
template <class T>
T lse_shift(T m) {
    return std::isfinite(m) ? m : T(0);
}

// s: zero-initialised; m: the group max; both kept layout through k_strides.
// x: shape `shape`, any strides.    s[r] += exp(x[i] − shift(m[r]))
template <class T>
void sum_exp_accumulate(T* s, const T* m, const Shape& k_strides, const T* x,
                        const Shape& x_strides, const Shape& shape) {
    const int64_t sk = shape.empty() ? 0 : k_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    for_each_run<2>(shape, {&k_strides, &x_strides}, [&](const auto& off, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
            const int64_t r = off[0] + i * sk;
            s[r] += math::exp_fast(x[off[1] + i * sx] - lse_shift(m[r]));
        }
    });
}

// dx: shape `shape`, contiguous; x: any strides; lse, dy: kept layout through k_strides.
//   dx[i] = dy[r] · exp(x[i] − lse[r])        (0 for a group of all -inf, lse = -inf)
template <class T>
void logsumexp_backward(T* dx, const T* x, const Shape& x_strides, const T* lse, const T* dy,
                        const Shape& k_strides, const Shape& shape) {
    const Shape dx_strides = contiguous_strides(shape);
    const int64_t sk = shape.empty() ? 0 : k_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    for_each_run<3>(shape, {&dx_strides, &x_strides, &k_strides}, [&](const auto& off, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
            const int64_t r = off[2] + i * sk;
            dx[off[0] + i] =
                lse[r] == neg_inf ? T(0) : dy[r] * math::exp_fast(x[off[1] + i * sx] - lse[r]);
        }
    });
}

}  // namespace cpu

namespace {

using autograd::Grads;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The reduced shape with size 1 on reduced dims (keepdim form), and whether each dim is reduced.
Shape keepdim_shape(const Shape& shape, const Dims& dims, const char* op) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    Shape out = shape;
    if (dims.empty()) {
        std::fill(out.begin(), out.end(), 1);
        return out;
    }
    std::vector<bool> seen(rank, false);
    for (int64_t d : dims) {
        int64_t nd = normalize_dim(d, rank, op);
        QK_CHECK(!seen[nd], "{}: dim {} listed twice in {}", op, d, dims);
        seen[nd] = true;
        out[nd] = 1;
    }
    return out;
}

Shape drop_reduced(const Shape& shape, const Shape& kept, const Dims& dims) {
    Shape out;
    for (size_t i = 0; i < shape.size(); ++i) {
        const bool reduced =
            dims.empty() ? true : std::any_of(dims.begin(), dims.end(), [&](int64_t d) {
                return normalize_dim(d, shape.size(), "sum") == int64_t(i);
            });
        if (!reduced) out.push_back(kept[i]);
    }
    return out;
}

// How many x elements fall into one output element: the product of the sizes of the reduced
// dims (a non-reduced dim with kept size 1 has size 1 too, so it does not change the product).
int64_t group_size(const Shape& shape, const Shape& kept) {
    int64_t n = 1;
    for (size_t i = 0; i < shape.size(); ++i)
        if (kept[i] == 1) n *= shape[i];
    return n;
}

// Strides that read a contiguous keepdim-layout tensor once per x element: 0 on size-1 dims.
Shape kept_strides(const Shape& kept) {
    Shape strides = contiguous_strides(kept);
    for (size_t i = 0; i < kept.size(); ++i)
        if (kept[i] == 1) strides[i] = 0;
    return strides;
}

// Sums x (any strides) into a fresh contiguous tensor of shape `target` (keepdim layout, same
// rank).
Tensor sum_into_shape(const Tensor& x, const Shape& target) {
    // The cpu adds into zeros; the cuda kernels write every output (0 where a group is empty).
    Tensor out = x.device() == Device::cpu ? zeros(target, x.dtype(), x.device())
                                           : Tensor::empty(target, x.dtype(), x.device());
    const Shape out_strides = kept_strides(target);
    on_device(
        "sum", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            T* o = out.data<T>();
            const T* p = x.data<T>();
            const int64_t last = x.dim() > 0 ? x.shape().back() : 0;
            if (last == 0 || out_strides.back() == 0) {  // the last dim is reduced too
                cpu::sum_accumulate(o, out_strides, p, x.strides(), x.shape());
                return;
            }
            // The last dim is kept (a bias gradient Σ_r dY[r, :], a broadcast add's backward):
            // threads take bands of it. Every output element is still summed in the same
            // order, so the result does not depend on the thread count.
            auto band = [&](int64_t begin, int64_t end) {
                Shape part = x.shape();
                part.back() = end - begin;
                cpu::sum_accumulate(o + begin * out_strides.back(), out_strides,
                                    p + begin * x.strides().back(), x.strides(), part);
            };
            parallel_for(last, band, x.numel() >= kParallelElementwise);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::sum_reduce(out.data<T>(), x.data<T>(), x.strides(), x.shape(), target);
        });
    return out;
}

void check_floating(const Tensor& x, const char* op) {
    QK_CHECK(is_compute_dtype(x.dtype()),
             "{}: needs a float32 or float64 tensor, got {} of shape {}", op, x.dtype(), x.shape());
}

// The group max of x (any strides) in keepdim layout; no autograd.
Tensor max_into_shape(const Tensor& x, const Shape& kept) {
    Tensor y = full(kept, -kInf, x.dtype(), x.device());
    on_device(
        "max", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::max_accumulate(y.data<T>(), kept_strides(kept), x.data<T>(), x.strides(),
                                x.shape());
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::max_reduce(y.data<T>(), x.data<T>(), x.strides(), x.shape(), kept);
        });
    return y;
}

// dx for max: see the tie rule in the header comment. y_kept, dy_kept: keepdim layout.
Tensor max_grad(const Tensor& x, const Tensor& y_kept, const Tensor& dy_in) {
    const Shape& kept = y_kept.shape();
    Tensor dy = dy_in.reshape(kept).contiguous();
    Tensor count = zeros(kept, x.dtype(), x.device());
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    on_device(
        "max", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            const Shape ks = kept_strides(kept);
            cpu::max_count_ties(count.data<T>(), y_kept.data<T>(), ks, x.data<T>(), x.strides(),
                                x.shape());
            cpu::max_backward(dx.data<T>(), x.data<T>(), x.strides(), y_kept.data<T>(),
                              dy.data<T>(), count.data<T>(), ks, x.shape());
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::max_backward(dx.data<T>(), x.data<T>(), x.strides(), y_kept.data<T>(),
                               dy.data<T>(), x.shape(), kept);
        });
    return dx;
}

// lse of x (any strides) in keepdim layout; no autograd.
Tensor logsumexp_into_shape(const Tensor& x, const Shape& kept) {
    Tensor lse = zeros(kept, x.dtype(), x.device());
    switch (x.device()) {
        case Device::cpu: {
            const Tensor m = max_into_shape(x, kept);  // the cuda kernel finds it itself
            dispatch_float(x.dtype(), [&](auto tag) {
                using T = decltype(tag);
                T* s = lse.data<T>();  // holds Σ exp(x − shift) until the last loop
                const T* mp = m.data<T>();
                cpu::sum_exp_accumulate(s, mp, kept_strides(kept), x.data<T>(), x.strides(),
                                        x.shape());
                for (int64_t r = 0; r < lse.numel(); ++r)
                    s[r] = cpu::lse_shift(mp[r]) + std::log(s[r]);
            });
            break;
        }
        case Device::cuda:
#ifdef QK_WITH_CUDA
            dispatch_float(x.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cuda::logsumexp_reduce(lse.data<T>(), x.data<T>(), x.strides(), x.shape(), kept);
            });
#else
            throw_built_without_cuda("logsumexp");
#endif
            break;
    }
    return lse;
}

Tensor logsumexp_grad(const Tensor& x, const Tensor& lse_kept, const Tensor& dy_in) {
    Tensor dy = dy_in.reshape(lse_kept.shape()).contiguous();
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    on_device(
        "logsumexp", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::logsumexp_backward(dx.data<T>(), x.data<T>(), x.strides(), lse_kept.data<T>(),
                                    dy.data<T>(), kept_strides(lse_kept.shape()), x.shape());
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::logsumexp_backward(dx.data<T>(), x.data<T>(), x.strides(), lse_kept.data<T>(),
                                     dy.data<T>(), x.shape(), lse_kept.shape());
        });
    return dx;
}

}  // namespace

Tensor sum_to(const Tensor& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    check_floating(x, "sum_to");
    QK_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(),
             "sum_to: shape {} does not broadcast to the input's shape {}", shape, x.shape());
    // Pad `shape` on the left to x's rank, reduce, then drop the padding.
    Shape padded(x.dim() - shape.size(), 1);
    padded.insert(padded.end(), shape.begin(), shape.end());
    Tensor y = sum_into_shape(x, padded).view(shape);
    return autograd::record("sum_to", y, {x},
                            [xs = x.shape()](const Tensor& dy) { return Grads{dy.expand(xs)}; });
}

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
    check_floating(x, "sum");
    const Shape kept = keepdim_shape(x.shape(), dims, "sum");
    Tensor y = sum_into_shape(x, kept);
    if (!keepdim) y = y.view(drop_reduced(x.shape(), kept, dims));
    // reshape, not view: dy may arrive non-contiguous (e.g. through a transpose of y).
    return autograd::record("sum", y, {x}, [xs = x.shape(), kept](const Tensor& dy) {
        return Grads{dy.reshape(kept).expand(xs)};
    });
}

Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
    check_floating(x, "mean");
    const Shape kept = keepdim_shape(x.shape(), dims, "mean");
    const int64_t count = group_size(x.shape(), kept);
    QK_CHECK(count > 0, "mean: reducing shape {} over dims {} averages zero elements", x.shape(),
             dims);
    return sum(x, dims, keepdim) * (1.0 / static_cast<double>(count));
}

Tensor max(const Tensor& x, const Dims& dims, bool keepdim) {
    check_floating(x, "max");
    const Shape kept = keepdim_shape(x.shape(), dims, "max");
    QK_CHECK(group_size(x.shape(), kept) > 0 || numel_of(kept) == 0,
             "max: reducing shape {} over dims {} takes the max of zero elements", x.shape(), dims);
    Tensor y_kept = max_into_shape(x, kept);
    Tensor y = keepdim ? y_kept : y_kept.view(drop_reduced(x.shape(), kept, dims));
    return autograd::record("max", y, {x},
                            [x = autograd::saved(x), y_kept = autograd::saved(y_kept)](
                                const Tensor& dy) { return Grads{max_grad(x, y_kept, dy)}; });
}

Tensor var(const Tensor& x, const Dims& dims, bool keepdim, int64_t correction) {
    check_floating(x, "var");
    const Shape kept = keepdim_shape(x.shape(), dims, "var");
    const int64_t count = group_size(x.shape(), kept);
    QK_CHECK(count - correction > 0,
             "var: reducing shape {} over dims {} gives {} elements per group; correction {} "
             "leaves no degrees of freedom (need more elements than the correction)",
             x.shape(), dims, count, correction);
    Tensor d = x - mean(x, dims, /*keepdim=*/true);
    return sum(d * d, dims, keepdim) * (1.0 / static_cast<double>(count - correction));
}

Tensor logsumexp(const Tensor& x, const Dims& dims, bool keepdim) {
    check_floating(x, "logsumexp");
    const Shape kept = keepdim_shape(x.shape(), dims, "logsumexp");
    Tensor lse_kept = logsumexp_into_shape(x, kept);
    Tensor y = keepdim ? lse_kept : lse_kept.view(drop_reduced(x.shape(), kept, dims));
    return autograd::record(
        "logsumexp", y, {x},
        [x = autograd::saved(x), lse_kept = autograd::saved(lse_kept)](const Tensor& dy) {
            return Grads{logsumexp_grad(x, lse_kept, dy)};
        });
}

}  // namespace qk
