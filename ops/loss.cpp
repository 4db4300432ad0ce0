// Cross-entropy, fused: log-softmax and the negative log-likelihood in one kernel per row, never
// materialising the (N, V) log-probabilities.
//
// Forward, per row i of logits x (N, V) with target t_i; rows whose target is ignore_index are
// skipped and n_valid counts the others:
//   m_i = max_j x_ij,   lse_i = m_i + log Σ_j exp(x_ij − m_i)       (every exp(x − m) <= 1)
//   loss_i = −log softmax(x_i)[t_i] = lse_i − x_{i, t_i}
//   L = (1 / n_valid) Σ_{valid i} loss_i
// Saved: the logits (the input itself, no copy), the targets, and lse per row (N values).
//
// Backward: loss_i = lse_i − x_{i,t_i}, ∂lse_i/∂x_ij = softmax_ij, so
//   dx_ij = (softmax_ij − [j == t_i]) · dL / n_valid,   softmax_ij = exp(x_ij − lse_i)
//          [term "p"]  [term "onehot"]   [term "scale"]
// and 0 on ignored rows.
// Why save lse rather than recompute the softmax statistics in backward: recomputing them means
// the max and Σ exp passes over the row again; with lse saved (N values: 8 KB at N = 2048) the
// backward is a single pass, read x, one exp, write dx. At V = 65 either is cheap; at GPT-2's
// V = 50257 that is one pass over a 200 KB row instead of three, and exp is the costly part.
//
// Accumulation: Σ exp per row in T, in math::lane_sum's 16 partial sums (ops/lane_sum.h: the
// same bits in every build type, vectorised or not; exp is
// math::exp_fast, see ops/elementwise_math.h); the sum of the N row losses in double and in row
// order, so that the loss does not depend on the thread count (cheap next to the N·V exps).
//
// linear_cross_entropy, the LM head and its loss as one op (z = x W̃ᵀ, L as above on z): on cuda
// at bf16 / fp16 the loss's forward kernel goes on, once lse_i is known, to write
//   G̃_ij = round((softmax_ij − [j == t_i]) · u / n_valid)     (zero past V, and on ignored rows)
// for the upstream gradient u the caller announces: the head's dỸ, which the backward GEMMs read
// (dx = G̃ W̃, dW = G̃ᵀ x̃). The backward's one kernel compares the u it got with the announced one
// on the device and rewrites G̃ from the logits only when they differ. The same formula in all
// three kernels, so the bits are the two ops'. What it saves on an H200 at GPT-2's vocabulary
// (16,384 rows of 50,257): the backward's read of the logits and its float32 dx (6.6 GB), and dỸ's
// copy into the padded GEMM's layout: about 4 ms of a 59 ms step, estimated.
//
// Bad input: targets must be int32 in [0, V) or ignore_index; a batch where every target is
// ignored has no mean (torch returns NaN): that is an error here, never a silent NaN.
// The CUDA twin is cuda/loss.cu; on cuda the targets are still checked here, on the host.
#include "ops/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/threading.h"
#include "ops/elementwise.h"
#include "ops/elementwise_math.h"  // math::exp_fast
#include "ops/lane_sum.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"
#include "ops/reduce.h"
#include "ops/rounded_copy.h"

namespace qk {

namespace cpu {

// Rows below this many logits in total run on one thread: waking the pool costs more.
constexpr int64_t kParallelWork = 1 << 15;

// x: (V), one row of logits. Returns m + log Σ exp(x − m), m = max x.
// (A function of its own: inlined into the parallel loop body, GCC left the max scalar.)
template <class T>
T row_logsumexp(const T* x, int64_t V) {
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < V; ++j) m = x[j] > m ? x[j] : m;
    const T S =
        math::lane_sum<T>(V, [&](int64_t j) { return math::exp_fast(x[j] - m); });  // Σ exp(x − m)
    return m + std::log(S);
}

// lse: (N) out, 0 on ignored rows; x: (N, V), rows x_ld apart; t: (N).
// Returns Σ_{valid i} (lse_i − x_{i,t_i}), summed in row order whatever the thread count, so that
// a run's losses do not depend on it.
template <class T>
double cross_entropy_forward(T* lse, const T* x, const int32_t* t, int64_t N, int64_t V,
                             int32_t ignore_index, int64_t x_ld) {
    std::vector<double> loss(N, 0.0);  // loss_i, 0 on ignored rows
    auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            if (t[i] == ignore_index) {
                lse[i] = 0;
                continue;
            }
            lse[i] = row_logsumexp(x + i * x_ld, V);
            loss[i] = double(lse[i]) - double(x[i * x_ld + t[i]]);
        }
    };
    parallel_for(N, rows, N * V >= kParallelWork);
    double total = 0;
    for (double l : loss) total += l;
    return total;
}

// dx: (N, V) out; x: (N, V), rows x_ld apart; t: (N); lse: (N). scale = dL / n_valid.
template <class T>
void cross_entropy_backward(T* dx, const T* x, const int32_t* t, const T* lse, int64_t N, int64_t V,
                            int32_t ignore_index, T scale, int64_t x_ld) {
    auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            T* dxr = dx + i * V;
            if (t[i] == ignore_index) {
                std::fill(dxr, dxr + V, T(0));
                continue;
            }
            const T* xr = x + i * x_ld;
            const T l = lse[i];
#pragma omp simd
            for (int64_t j = 0; j < V; ++j) dxr[j] = math::exp_fast(xr[j] - l) * scale;  // p·scale
            dxr[t[i]] -= scale;  // − onehot · scale
        }
    };
    parallel_for(N, rows, N * V >= kParallelWork);
}

template double cross_entropy_forward<float>(float*, const float*, const int32_t*, int64_t, int64_t,
                                             int32_t, int64_t);
template double cross_entropy_forward<double>(double*, const double*, const int32_t*, int64_t,
                                              int64_t, int32_t, int64_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, const float*,
                                            int64_t, int64_t, int32_t, float, int64_t);
template void cross_entropy_backward<double>(double*, const double*, const int32_t*, const double*,
                                             int64_t, int64_t, int32_t, double, int64_t);

}  // namespace cpu

namespace {

using autograd::Grads;

void check_cross_entropy_args(const Tensor& logits, const Tensor& targets) {
    QK_CHECK(is_compute_dtype(logits.dtype()) && logits.dim() == 2,
             "cross_entropy: logits must be a (N, V) float32 or float64 tensor, got {} of shape {}",
             logits.dtype(), logits.shape());
    QK_CHECK(targets.dtype() == kI32 && targets.dim() == 1,
             "cross_entropy: targets must be a (N) int32 tensor of class ids, got {} of shape {} "
             "(expected int32 of shape [{}], ids in [0, {}) or ignore_index)",
             targets.dtype(), targets.shape(), logits.size(0), logits.size(1));
    QK_CHECK(
        targets.size(0) == logits.size(0),
        "cross_entropy: logits {} and targets {} disagree on N (expected targets of shape [{}])",
        logits.shape(), targets.shape(), logits.size(0));
    QK_CHECK(logits.device() == targets.device(),
             "cross_entropy: logits {} are on {}, targets {} on {} (expected one device)",
             logits.shape(), logits.device(), targets.shape(), targets.device());
}

// Checks every target is in [0, V) or ignore_index, and returns how many are not ignored.
int64_t count_valid_targets(const int32_t* t, int64_t N, int64_t V, int32_t ignore_index) {
    int64_t n_valid = 0;
    for (int64_t i = 0; i < N; ++i) {
        if (t[i] == ignore_index) continue;
        QK_CHECK(
            t[i] >= 0 && t[i] < V,
            "cross_entropy: target {} at row {} is out of range [0, {}) (logits shape [{}, {}], "
            "ignore_index {})",
            t[i], i, V, N, V, ignore_index);
        ++n_valid;
    }
    QK_CHECK(n_valid > 0,
             "cross_entropy: all {} targets equal ignore_index {}: the mean over zero rows is "
             "undefined",
             N, ignore_index);
    return n_valid;
}

#ifdef QK_WITH_CUDA
// count_valid_targets for targets t on cuda. They come to the host to be checked (N int32s, one
// small synchronous copy): a bad target must be an error here, not an out-of-bounds read in the
// kernel.
int64_t count_valid_device_targets(const Tensor& t, int64_t V, int32_t ignore_index) {
    const Tensor host_t = to_device(t, Device::cpu);
    return count_valid_targets(host_t.data<int32_t>(), t.size(0), V, ignore_index);
}
#endif

// The logits as the kernels read them: rows of unit stride, any distance apart (a padded head's
// narrowed (N, V) view of its (N, V′) output is read where it is, not copied out), else a
// contiguous copy.
Tensor rows_in_place(const Tensor& logits) {
    const bool readable = logits.strides()[1] == 1 && logits.strides()[0] >= logits.size(1);
    return readable ? autograd::saved(logits) : autograd::contiguous_input(logits);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int32_t ignore_index,
                     Precision rounded_copy) {
    check_cross_entropy_args(logits_in, targets_in);
    const Tensor x = rows_in_place(logits_in);
    const Tensor t = autograd::contiguous_input(targets_in);
    const int64_t N = x.size(0), V = x.size(1), x_ld = x.strides()[0];
    Tensor lse = Tensor::empty({N}, x.dtype(), x.device());
    int64_t n_valid = 0;
    Tensor loss;
    switch (x.device()) {
        case Device::cpu: {
            n_valid = count_valid_targets(t.data<int32_t>(), N, V, ignore_index);
            double total = 0;
            dispatch_float(x.dtype(), [&](auto tag) {
                using T = decltype(tag);
                total = cpu::cross_entropy_forward(lse.data<T>(), x.data<T>(), t.data<int32_t>(), N,
                                                   V, ignore_index, x_ld);
            });
            loss = full({}, total / double(n_valid), x.dtype(), x.device());
            break;
        }
        case Device::cuda: {
#ifdef QK_WITH_CUDA
            n_valid = count_valid_device_targets(t, V, ignore_index);
            loss = Tensor::empty({}, x.dtype(), x.device());  // written by the kernel
            dispatch_float(x.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cuda::cross_entropy_forward(loss.data<T>(), lse.data<T>(), x.data<T>(),
                                            t.data<int32_t>(), N, V, ignore_index, n_valid, x_ld);
            });
#else
            throw_built_without_cuda("cross_entropy");
#endif
            break;
        }
    }
    auto backward = [x = autograd::saved(x), t = autograd::saved(t), lse = autograd::saved(lse),
                     n_valid, ignore_index, rounded_copy, x_ld](const Tensor& dloss) {
        Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
        const Tensor dx_half = rounded_copy_for(dx, rounded_copy);
        switch (x.device()) {
            case Device::cpu:
                dispatch_float(x.dtype(), [&](auto tag) {
                    using T = decltype(tag);
                    const T scale = T(dloss.item() / double(n_valid));
                    cpu::cross_entropy_backward(dx.data<T>(), x.data<T>(), t.data<int32_t>(),
                                                lse.data<T>(), x.size(0), x.size(1), ignore_index,
                                                scale, x_ld);
                });
                break;
            case Device::cuda: {
#ifdef QK_WITH_CUDA
                QK_CHECK(dloss.device() == Device::cuda && dloss.numel() == 1 &&
                             dloss.dtype() == x.dtype(),
                         "cross_entropy backward: the upstream gradient must be one {} element on "
                         "cuda like the logits, got {} of shape {} on {}",
                         x.dtype(), dloss.dtype(), dloss.shape(), dloss.device());
                Tensor dl = dloss.contiguous();
                dispatch_float(x.dtype(), [&](auto tag) {
                    using T = decltype(tag);
                    cuda::cross_entropy_backward(dx.data<T>(), x.data<T>(), t.data<int32_t>(),
                                                 lse.data<T>(), dl.data<T>(), x.size(0), x.size(1),
                                                 ignore_index, n_valid, x_ld, half_bits(dx_half),
                                                 rounded_copy == Precision::bf16);
                });
                keep_rounded_copy(dx, dx_half);
#else
                throw_built_without_cuda("cross_entropy backward");
#endif
                break;
            }
        }
        return Grads{dx};
    };
    return autograd::record("cross_entropy", loss, {logits_in}, std::move(backward));
}

LinearCrossEntropy linear_cross_entropy(const Tensor& x, const Tensor& weight,
                                        const Tensor& targets, Precision precision,
                                        int32_t ignore_index, double loss_gradient, double z_loss) {
    matmul_impl::check_linear_args(x, weight, {}, precision);
    QK_CHECK(std::isfinite(z_loss) && z_loss >= 0,
             "linear_cross_entropy: z_loss must be a finite weight >= 0, got {}", z_loss);
    QK_CHECK(x.dim() == 2, "linear_cross_entropy: x must be (N, K) rows, got {}", x.shape());
    QK_CHECK(std::isfinite(static_cast<float>(loss_gradient)),
             "linear_cross_entropy: loss_gradient must be finite in float32 (the upstream "
             "gradient the backward will give the loss), got {}",
             loss_gradient);
    const bool mixed = precision == Precision::bf16 || precision == Precision::fp16;
    const bool wants_gradient =
        autograd::grad_enabled() && (x.requires_grad() || weight.requires_grad());
    if (!mixed || !wants_gradient || x.device() != Device::cuda || x.dtype() != kF32 ||
        weight.dtype() != kF32) {  // the two ops
        const Tensor logits = linear(x, weight, {}, precision);
        // The loss's own rounding of the logits' gradient, unless the z-loss adds to it.
        const Precision rounded = mixed && z_loss == 0 ? precision : Precision::full;
        const Tensor ce = cross_entropy(logits, targets, ignore_index, rounded);
        if (z_loss == 0) return {ce, logits.detach(), ce.detach()};
        const Tensor lse = logsumexp(logits, {-1});
        return {ce + mean(lse * lse) * z_loss, logits.detach(), ce.detach()};
    }
    QK_CHECK(targets.dtype() == kI32 && targets.dim() == 1 && targets.size(0) == x.size(0) &&
                 targets.device() == x.device(),
             "linear_cross_entropy: targets must be ({}) int32 on {} like x {}, got {} {} on {}",
             x.size(0), x.device(), x.shape(), targets.dtype(), targets.shape(), targets.device());
#ifdef QK_WITH_CUDA
    const Tensor t = autograd::contiguous_input(targets);
    const int64_t n_valid = count_valid_device_targets(t, weight.size(0), ignore_index);
    return precision == Precision::bf16
               ? matmul_impl::linear_cross_entropy_bf16(x, weight, t, ignore_index, n_valid,
                                                        loss_gradient, z_loss)
               : matmul_impl::linear_cross_entropy_fp16(x, weight, t, ignore_index, n_valid,
                                                        loss_gradient, z_loss);
#else
    throw_built_without_cuda("linear_cross_entropy");
#endif
}

}  // namespace qk
