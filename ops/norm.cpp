// Normalisations: layer_norm and rms_norm over the last dim (lp_normalize, along any dim, is in
// ops/lp_normalize.cpp; ops/norm.h declares all three).
//
// Each op sees x as (rows, C), C the normalised dim, and works one row at a time.
//
// layer_norm   mean = Σx / C    var = Σ(x - mean)² / C    rstd = 1 / sqrt(var + eps)
//              xhat = (x - mean) · rstd           y = xhat · weight + bias
//   saves      x, weight, mean (rows), rstd (rows)   (xhat is recomputed, not stored)
//   backward   Let dxhat = dy · weight, the gradient reaching xhat. xhat_j depends on x_i directly,
//              through mean (∂mean/∂x_i = 1/C) and through rstd (∂rstd/∂x_i = -rstd² xhat_i / C):
//                  ∂xhat_j/∂x_i = rstd · (δ_ij - 1/C - xhat_j · xhat_i / C)
//              so, summing dxhat_j over j, three named terms:
//                  dx = rstd · ( dxhat  -  mean(dxhat)  -  xhat · mean(dxhat · xhat) )
//                                direct    mean term       rstd term
//              dweight = Σ_rows dy · xhat          dbias = Σ_rows dy
//
// rms_norm     rstd = 1 / sqrt(Σx² / C + eps)     xhat = x · rstd     y = xhat · weight
//   saves      x, weight, rstd (rows)
//   backward   as layer_norm without the mean: ∂xhat_j/∂x_i = rstd · (δ_ij - xhat_j · xhat_i / C)
//                  dx = rstd · ( dxhat  -  xhat · mean(dxhat · xhat) )        dxhat = dy · weight
//                                direct    rstd term
//              dweight = Σ_rows dy · xhat.  Without weight, dxhat = dy and there is no dweight.
//
// rotate       (either norm, with RoPE's tables) y = R_t · norm(x) for a row at position t, R_t
//              the block rotation of ops/rope.cpp. Saves nothing more: R is linear and its tables
//              are constants. Backward: the norm's output gets Rᵀ_t dy (the rotation by −angle),
//              and everything above (dx, dweight, dbias) reads that in place of dy.
//
// Kernels (namespace cpu): v1 mirrors the formulas and is the tests' reference; v2 is what the
// ops call. Why v2 is faster, and how its sums keep float32 accurate: above the v2 kernels.
#include "ops/norm.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/elementwise.h"
#include "ops/lane_sum.h"
#include "ops/norm_common.h"
#include "ops/on_device.h"
#include "ops/rounded_copy.h"

namespace qk {

namespace cpu {

// ---- v1: the formulas, plain loops, one thread -----------------------------------------------

template <class T>
void layer_norm_forward_v1(T* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                           int64_t rows, int64_t C, T eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * C;
        T sum = 0, var = 0;
        for (int64_t c = 0; c < C; ++c) sum += xr[c];
        const T m = sum / T(C);
        for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
        var /= T(C);
        for (int64_t c = 0; c < C; ++c)
            y[r * C + c] = (xr[c] - m) / std::sqrt(var + eps) * weight[c] + (bias ? bias[c] : T(0));
        mean[r] = m;
        rstd[r] = T(1) / std::sqrt(var + eps);
    }
}

template <class T>
void layer_norm_backward_v1(T* dx, T* dweight, T* dbias, const T* dy, const T* x, const T* mean,
                            const T* rstd, const T* weight, int64_t rows, int64_t C) {
    std::vector<T> xhat(C), dxhat(C);
    std::fill(dweight, dweight + C, T(0));
    if (dbias) std::fill(dbias, dbias + C, T(0));
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r * C;
        T mean_dxhat = 0, mean_dxhat_xhat = 0;
        for (int64_t c = 0; c < C; ++c) {
            xhat[c] = (x[o + c] - mean[r]) * rstd[r];
            dxhat[c] = dy[o + c] * weight[c];
            mean_dxhat += dxhat[c] / T(C);
            mean_dxhat_xhat += dxhat[c] * xhat[c] / T(C);
        }
        for (int64_t c = 0; c < C; ++c) {
            dx[o + c] = rstd[r] * (dxhat[c] - mean_dxhat - xhat[c] * mean_dxhat_xhat);
            dweight[c] += dy[o + c] * xhat[c];
            if (dbias) dbias[c] += dy[o + c];
        }
    }
}

template <class T>
void rms_norm_forward_v1(T* y, T* rstd, const T* x, const T* weight, int64_t rows, int64_t C,
                         T eps) {
    for (int64_t r = 0; r < rows; ++r) {
        T ms = 0;
        for (int64_t c = 0; c < C; ++c) ms += x[r * C + c] * x[r * C + c];
        ms /= T(C);
        for (int64_t c = 0; c < C; ++c)
            y[r * C + c] = x[r * C + c] / std::sqrt(ms + eps) * (weight ? weight[c] : T(1));
        rstd[r] = T(1) / std::sqrt(ms + eps);
    }
}

template <class T>
void rms_norm_backward_v1(T* dx, T* dweight, const T* dy, const T* x, const T* rstd,
                          const T* weight, int64_t rows, int64_t C) {
    std::vector<T> xhat(C), dxhat(C);
    if (dweight) std::fill(dweight, dweight + C, T(0));
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r * C;
        T mean_dxhat_xhat = 0;
        for (int64_t c = 0; c < C; ++c) {
            xhat[c] = x[o + c] * rstd[r];
            dxhat[c] = dy[o + c] * (weight ? weight[c] : T(1));
            mean_dxhat_xhat += dxhat[c] * xhat[c] / T(C);
        }
        for (int64_t c = 0; c < C; ++c) {
            dx[o + c] = rstd[r] * (dxhat[c] - xhat[c] * mean_dxhat_xhat);
            if (dweight) dweight[c] += dy[o + c] * xhat[c];
        }
    }
}

// ---- v2: one read of each input row from memory, vectorised, threads over rows ---------------
//
// v2 (no suffix) is what the ops call, 4-30x faster than v1:
// (a) row sums keep 16 SIMD-lane partial sums (a plain float `acc += x[c]` is one serial chain of
// dependent adds, which the compiler may not reassociate), (b) it multiplies by rstd instead of
// dividing per element and recomputes xhat instead of staging rows in buffers, (c) the thread
// pool over rows.
//
// Statistics: two passes over a row (mean, then Σ(x - mean)²) rather than Welford or Σx, Σx².
// The row (C = 384 floats = 1.5 KB) is in L1 after the first pass, so memory traffic is still one
// read of x; Welford needs a division per element and a loop-carried running mean (it does not
// vectorise), and Σx² - (Σx)²/C cancels catastrophically when |mean| ≫ std. Row sums accumulate in
// T (float for float32), like llm.c, but a row sum that stands alone goes through math::lane_sum
// (16 interleaved partial sums, the same order in every build): left to `omp simd reduction`, a
// build that does not vectorise (debug, sanitizers) sums a row in one serial chain, and float32
// layer_norm at C = 4096, mean 100 measured 10x less accurate there (5e-5). With lanes, float32
// stays within 1e-6 of float64 (relative to the output's scale) at C = 4096 in the tests.

// Runs row(r, dw, db) for every row, each thread adding its rows' parameter gradients into its own
// (C) buffers dw, db, summed in thread order afterwards: the result does not depend on which
// thread finished first (atomics or a critical section would, and a run would not replay exactly).
template <class T, class RowFn>
void for_rows_accumulating(T* dweight, T* dbias, int64_t rows, int64_t C, RowFn row) {
    const int threads = rows * C >= kNormParallelWork ? num_threads() : 1;
    std::vector<T> partial(size_t(threads) * 2 * C, T(0));  // per thread: dw (C), db (C)
    auto share = [&](int t) {
        T* dw = partial.data() + size_t(t) * 2 * C;
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; ++r) row(r, dw, dw + C);
    };
    parallel_run(threads, share);
    for (int64_t c = 0; c < C; ++c) {
        T dw = 0, db = 0;
        for (int t = 0; t < threads; ++t) {
            dw += partial[size_t(t) * 2 * C + c];
            db += partial[size_t(t) * 2 * C + C + c];
        }
        if (dweight) dweight[c] = dw;
        if (dbias) dbias[c] = db;
    }
}

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                        int64_t rows, int64_t C, T eps) {
    auto range = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T* xr = x + r * C;
            T* yr = y + r * C;
            const T m = math::lane_sum<T>(C, [=](int64_t c) { return xr[c]; }) / T(C);
            // Second pass over the row, now in L1: Σ(x - mean)², no cancellation against mean².
            const T var =
                math::lane_sum<T>(C, [=](int64_t c) { return (xr[c] - m) * (xr[c] - m); }) / T(C);
            const T s = T(1) / std::sqrt(var + eps);
            if (bias) {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * weight[c] + bias[c];
            } else {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * weight[c];
            }
            mean[r] = m;
            rstd[r] = s;
        }
    };
    parallel_for(rows, range, rows * C >= kNormParallelWork);
}

// One row: dxr (C) written; dw, db (C) accumulated; dyr, xr, weight (C); m, s its mean and rstd.
// The two row sums share their loop with the parameter gradients, so they use `omp simd
// reduction` rather than lane_sum: their terms have random signs (no offset to lose precision
// to), and fusing saves a pass that measured 1.5-2x on this kernel.
template <class T>
void layer_norm_backward_row(T* dxr, T* dw, T* db, const T* dyr, const T* xr, const T* weight, T m,
                             T s, int64_t C) {
    T sum_dxhat = 0, sum_dxhat_xhat = 0;
#pragma omp simd reduction(+ : sum_dxhat, sum_dxhat_xhat)
    for (int64_t c = 0; c < C; ++c) {
        const T xhat = (xr[c] - m) * s, dxhat = dyr[c] * weight[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dw[c] += dyr[c] * xhat;  // dweight = Σ_rows dy · xhat
        db[c] += dyr[c];         // dbias = Σ_rows dy
    }
    const T mean_dxhat = sum_dxhat / T(C), mean_dxhat_xhat = sum_dxhat_xhat / T(C);
#pragma omp simd  // second pass over xr, dyr: in L1
    for (int64_t c = 0; c < C; ++c) {
        const T xhat = (xr[c] - m) * s, dxhat = dyr[c] * weight[c];
        //              direct   mean term     rstd term
        dxr[c] = s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
}

template <class T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dy, const T* x, const T* mean,
                         const T* rstd, const T* weight, int64_t rows, int64_t C) {
    for_rows_accumulating(dweight, dbias, rows, C, [=](int64_t r, T* dw, T* db) {
        layer_norm_backward_row(dx + r * C, dw, db, dy + r * C, x + r * C, weight, mean[r], rstd[r],
                                C);
    });
}

template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* weight, int64_t rows, int64_t C, T eps) {
    auto range = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T* xr = x + r * C;
            T* yr = y + r * C;
            const T ms = math::lane_sum<T>(C, [=](int64_t c) { return xr[c] * xr[c]; }) / T(C);
            const T s = T(1) / std::sqrt(ms + eps);
            if (weight) {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s * weight[c];
            } else {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s;
            }
            rstd[r] = s;
        }
    };
    parallel_for(rows, range, rows * C >= kNormParallelWork);
}

// One row: dxr (C) written; dw (C) accumulated; dyr, xr (C); weight (C) or nullptr; s its rstd.
// The row sum shares its loop with dweight, as in layer_norm_backward_row.
template <class T>
void rms_norm_backward_row(T* dxr, T* dw, const T* dyr, const T* xr, const T* weight, T s,
                           int64_t C) {
    T sum_dxhat_xhat = 0;
#pragma omp simd reduction(+ : sum_dxhat_xhat)
    for (int64_t c = 0; c < C; ++c) {
        const T xhat = xr[c] * s, dxhat = dyr[c] * (weight ? weight[c] : T(1));
        sum_dxhat_xhat += dxhat * xhat;
        dw[c] += dyr[c] * xhat;  // dweight = Σ_rows dy · xhat (discarded without weight)
    }
    const T mean_dxhat_xhat = sum_dxhat_xhat / T(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
        const T xhat = xr[c] * s, dxhat = dyr[c] * (weight ? weight[c] : T(1));
        dxr[c] = s * (dxhat - xhat * mean_dxhat_xhat);  // direct - rstd term
    }
}

template <class T>
void rms_norm_backward(T* dx, T* dweight, const T* dy, const T* x, const T* rstd, const T* weight,
                       int64_t rows, int64_t C) {
    for_rows_accumulating(dweight, static_cast<T*>(nullptr), rows, C, [=](int64_t r, T* dw, T*) {
        rms_norm_backward_row(dx + r * C, dw, dy + r * C, x + r * C, weight, rstd[r], C);
    });
}

QK_NORM_INSTANTIATE(layer_norm_forward_v1)
QK_NORM_INSTANTIATE(layer_norm_forward)
QK_NORM_INSTANTIATE(layer_norm_backward_v1)
QK_NORM_INSTANTIATE(layer_norm_backward)
QK_NORM_INSTANTIATE(rms_norm_forward_v1)
QK_NORM_INSTANTIATE(rms_norm_forward)
QK_NORM_INSTANTIATE(rms_norm_backward_v1)
QK_NORM_INSTANTIATE(rms_norm_backward)

}  // namespace cpu

namespace {

using autograd::Grads;

// A per-channel parameter (weight or bias): undefined, or (C) with x's dtype and device.
void check_param(const char* op, const char* name, const Tensor& t, const Tensor& x) {
    if (!t.defined()) return;
    QK_CHECK(t.dtype() == x.dtype() && t.device() == x.device(),
             "{}: {} is {} on {} but x is {} on {} (expected the same dtype and device)", op, name,
             t.dtype(), t.device(), x.dtype(), x.device());
    QK_CHECK(t.shape() == Shape{x.size(-1)},
             "{}: {} has shape {}, expected [{}] (the last dim of x, which has shape {})", op, name,
             t.shape(), x.size(-1), x.shape());
}

// Typed data pointer, or nullptr for an undefined tensor ("no weight", "no bias").
template <class T>
T* data_or_null(const Tensor& t) {
    return t.defined() ? t.data<T>() : nullptr;
}

// x's rows where they lie, for the cuda kernels: when x (on cuda, its last dim contiguous) has
// rows that up to three strides describe (a per-head view of c_attn's output: (B, H, T) rows), it
// is read in place, not copied first; otherwise none, and x is made contiguous.
std::optional<NormRows> rows_in_place(const Tensor& x) {
    if (x.device() != Device::cuda || x.dim() < 2 || x.strides().back() != 1 || x.numel() == 0)
        return std::nullopt;
    NormRows rows;
    rows.rank = 0;
    for (int64_t d = 0; d + 1 < x.dim(); ++d) {
        const int64_t size = x.size(d), stride = x.strides()[d];
        if (size == 1) continue;
        const int last = rows.rank - 1;
        if (last >= 0 && rows.strides[last] == size * stride) {  // steps evenly into this dim
            rows.sizes[last] *= size;
            rows.strides[last] = stride;
        } else if (rows.rank == 3) {
            return std::nullopt;
        } else {
            rows.sizes[rows.rank] = size, rows.strides[rows.rank] = stride;
            ++rows.rank;
        }
    }
    if (rows.rank == 0) rows = NormRows::contiguous(1, x.size(-1));
    return rows;
}

// The input as the kernels read it (saved for the backward), and where its rows are.
std::pair<Tensor, NormRows> norm_input(const Tensor& x_in, int64_t rows, int64_t C) {
    if (const auto in_place = rows_in_place(x_in)) return {autograd::saved(x_in), *in_place};
    return {autograd::contiguous_input(x_in), NormRows::contiguous(rows, C)};
}

// A rotation of the norm's output (`rotate` in ops/norm.h), ready for the kernels: the tables
// contiguous, x's dim −2 the positions; in_kernel where the cuda kernels turn the rows themselves.
struct OutputRotation {
    Tensor cos, sin;
    int64_t positions = 1;
    bool in_kernel = false;
    explicit operator bool() const { return cos.defined(); }
    template <class T>
    cuda::RowRotation<T> for_kernel() const {
        if (!in_kernel) return {};
        return {cos.data<T>(), sin.data<T>(), positions};
    }
};

OutputRotation output_rotation(const char* op, const RopeTables& rotate, const Tensor& x) {
    if (!rotate.cos.defined() && !rotate.sin.defined()) return {};
    QK_CHECK(rotate.cos.defined() && rotate.sin.defined(),
             "{}: rotate needs both RoPE tables, cos and sin (x of shape {})", op, x.shape());
    check_rope_tables(op, x, rotate.cos, rotate.sin);
    return {rotate.cos.contiguous(), rotate.sin.contiguous(), x.size(-2),
            x.device() == Device::cuda && cuda::norm_rotates(x.size(-1))};
}

// y turned by the angles (direction +1, the forward) or dy by their negatives (−1, the backward:
// a rotation's transpose is its inverse), where the kernels do not do it in their own pass.
Tensor rotated_outside_kernel(const Tensor& t, const OutputRotation& rotation, int direction) {
    return rotation && !rotation.in_kernel ? rope_rotated(t, rotation.cos, rotation.sin, direction)
                                           : t;
}

// The backward's gradient for x. Where the autograd engine handed the node x's gradient so far
// (`into`, Node::adds_into_input_gradient: a residual stream's), dx goes into it and none is
// returned: added by the cuda kernel in its own pass (written_in_kernel), or here on the cpu.
Tensor added_into(const Tensor& into, const Tensor& dx, bool written_in_kernel) {
    if (!into.defined()) return dx;
    if (written_in_kernel) {
        mark_written(into);
    } else {
        Tensor target = into;
        add_(target, dx);
    }
    return Tensor();
}

// add_layer_norm / add_rms_norm: the residual add done by the norm's kernel. The kernel reads x
// and delta and writes their sum, the norm's input, recorded as the add op records its result
// (before the kernel writes it: recording reads no values), so the autograd graph is the two ops'.
struct ResidualAdd {
    Tensor x_in, delta_in;  // the caller's
    Tensor x, delta;        // contiguous, as the kernel reads them
    Tensor sum;             // the kernel's output
    template <class T>
    cuda::RowAdd<T> for_kernel() const {
        return {delta.data<T>(), sum.data<T>()};
    }
};

ResidualAdd residual_add(const Tensor& x, const Tensor& delta) {
    return {x, delta, autograd::contiguous_input(x), autograd::contiguous_input(delta),
            Tensor::empty(x.shape(), x.dtype(), x.device())};
}

// Whether the norm's kernel can add x + delta (else add_*_norm runs the two ops).
bool kernel_adds(const Tensor& x, const Tensor& delta) {
    return x.defined() && delta.defined() && x.device() == Device::cuda &&
           delta.device() == Device::cuda && x.dtype() == kF32 && delta.dtype() == kF32 &&
           x.shape() == delta.shape() && x.dim() >= 1 && cuda::norm_adds_rows(x.size(-1));
}

// The sum, recorded as add(x, delta) records it: the norm's input.
Tensor recorded_sum(const ResidualAdd& add) {
    return autograd::record("add", add.sum, {add.x_in, add.delta_in}, [](const Tensor& ds) {
        return Grads{ds, ds};  // the shapes are equal: add's sum_to is the identity
    });
}

// The half copy a norm writes beside y: none where y is rotated after the kernel.
Tensor rounded_copy_unless_rotated_after(const Tensor& y, Precision rounded_copy,
                                         const OutputRotation& rotation) {
    return rounded_copy_for(y, rotation && !rotation.in_kernel ? Precision::full : rounded_copy);
}

}  // namespace

namespace {

// layer_norm, or with `add` its fused residual add (x_in is then the recorded add->sum, which the
// kernel writes from add->x and add->delta).
Tensor layer_norm_body(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                       double eps, Precision rounded_copy, const RopeTables& rotate,
                       const ResidualAdd* add) {
    check_norm_input("layer_norm", x_in, eps);
    const OutputRotation rotation = output_rotation("layer_norm", rotate, x_in);
    QK_CHECK(weight_in.defined(), "layer_norm: weight is required (shape [{}]), got none",
             x_in.size(-1));
    check_param("layer_norm", "weight", weight_in, x_in);
    check_param("layer_norm", "bias", bias_in, x_in);
    const int64_t C = x_in.size(-1), rows = x_in.numel() / std::max<int64_t>(C, 1);
    const auto [x, x_rows] = norm_input(x_in, rows, C);
    const Tensor weight = autograd::contiguous_input(weight_in);
    const Tensor bias = autograd::contiguous_input(bias_in);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor mean = Tensor::empty({rows}, x.dtype(), x.device()), rstd = empty_like(mean);
    const Tensor y_half = rounded_copy_unless_rotated_after(y, rounded_copy, rotation);
    on_device(
        "layer_norm", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::layer_norm_forward(y.data<T>(), mean.data<T>(), rstd.data<T>(), x.data<T>(),
                                    weight.data<T>(), data_or_null<T>(bias), rows, C, T(eps));
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::layer_norm_forward(y.data<T>(), mean.data<T>(), rstd.data<T>(),
                                     add ? add->x.data<T>() : x.data<T>(), x_rows, weight.data<T>(),
                                     data_or_null<T>(bias), rows, C, T(eps), half_bits(y_half),
                                     rounded_copy == Precision::bf16, rotation.for_kernel<T>(),
                                     add ? add->for_kernel<T>() : cuda::RowAdd<T>{});
        });
    y = rotated_outside_kernel(y, rotation, +1);
    keep_rounded_copy(y, y_half);
    return autograd::record_adding(
        "layer_norm", y, {x_in, weight_in, bias_in},
        [x = x, x_rows = x_rows, weight = autograd::saved(weight), mean = autograd::saved(mean),
         rstd = autograd::saved(rstd), has_bias = bias.defined(), rows, C,
         rotation](const Tensor& dy_in, const Tensor& into) {
            Tensor dy = rotated_outside_kernel(dy_in.contiguous(), rotation, -1);
            const bool add_in_kernel = into.defined() && x.device() == Device::cuda;
            Tensor dx = add_in_kernel ? into : Tensor::empty(x.shape(), x.dtype(), x.device());
            Tensor dweight = empty_like(weight);
            Tensor dbias = has_bias ? empty_like(weight) : Tensor();
            on_device(
                "layer_norm backward", x.device(), x.dtype(),
                [&](auto tag) {
                    using T = decltype(tag);
                    cpu::layer_norm_backward(
                        dx.data<T>(), dweight.data<T>(), data_or_null<T>(dbias), dy.data<T>(),
                        x.data<T>(), mean.data<T>(), rstd.data<T>(), weight.data<T>(), rows, C);
                },
                [&](auto tag) {
                    using T = decltype(tag);
                    cuda::layer_norm_backward(
                        dx.data<T>(), dweight.data<T>(), data_or_null<T>(dbias), dy.data<T>(),
                        x.data<T>(), x_rows, mean.data<T>(), rstd.data<T>(), weight.data<T>(), rows,
                        C, rotation.for_kernel<T>(), add_in_kernel);
                });
            return Grads{added_into(into, dx, add_in_kernel), dweight, dbias};
        });
}

// rms_norm, or with `add` its fused residual add, as layer_norm_body.
Tensor rms_norm_body(const Tensor& x_in, const Tensor& weight_in, double eps,
                     Precision rounded_copy, const RopeTables& rotate, const ResidualAdd* add) {
    check_norm_input("rms_norm", x_in, eps);
    const OutputRotation rotation = output_rotation("rms_norm", rotate, x_in);
    check_param("rms_norm", "weight", weight_in, x_in);
    const int64_t C = x_in.size(-1), rows = x_in.numel() / std::max<int64_t>(C, 1);
    const auto [x, x_rows] = norm_input(x_in, rows, C);
    const Tensor weight = autograd::contiguous_input(weight_in);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor rstd = Tensor::empty({rows}, x.dtype(), x.device());
    const Tensor y_half = rounded_copy_unless_rotated_after(y, rounded_copy, rotation);
    on_device(
        "rms_norm", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::rms_norm_forward(y.data<T>(), rstd.data<T>(), x.data<T>(), data_or_null<T>(weight),
                                  rows, C, T(eps));
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::rms_norm_forward(y.data<T>(), rstd.data<T>(),
                                   add ? add->x.data<T>() : x.data<T>(), x_rows,
                                   data_or_null<T>(weight), rows, C, T(eps), half_bits(y_half),
                                   rounded_copy == Precision::bf16, rotation.for_kernel<T>(),
                                   add ? add->for_kernel<T>() : cuda::RowAdd<T>{});
        });
    y = rotated_outside_kernel(y, rotation, +1);
    keep_rounded_copy(y, y_half);
    return autograd::record_adding(
        "rms_norm", y, {x_in, weight_in},
        [x = x, x_rows = x_rows, weight = autograd::saved(weight), rstd = autograd::saved(rstd),
         rows, C, rotation](const Tensor& dy_in, const Tensor& into) {
            Tensor dy = rotated_outside_kernel(dy_in.contiguous(), rotation, -1);
            const bool add_in_kernel = into.defined() && x.device() == Device::cuda;
            Tensor dx = add_in_kernel ? into : Tensor::empty(x.shape(), x.dtype(), x.device());
            Tensor dweight = weight.defined() ? empty_like(weight) : Tensor();
            on_device(
                "rms_norm backward", x.device(), x.dtype(),
                [&](auto tag) {
                    using T = decltype(tag);
                    cpu::rms_norm_backward(dx.data<T>(), data_or_null<T>(dweight), dy.data<T>(),
                                           x.data<T>(), rstd.data<T>(), data_or_null<T>(weight),
                                           rows, C);
                },
                [&](auto tag) {
                    using T = decltype(tag);
                    cuda::rms_norm_backward(dx.data<T>(), data_or_null<T>(dweight), dy.data<T>(),
                                            x.data<T>(), x_rows, rstd.data<T>(),
                                            data_or_null<T>(weight), rows, C,
                                            rotation.for_kernel<T>(), add_in_kernel);
                });
            return Grads{added_into(into, dx, add_in_kernel), dweight};
        });
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  Precision rounded_copy, const RopeTables& rotate) {
    return layer_norm_body(x, weight, bias, eps, rounded_copy, rotate, nullptr);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, Precision rounded_copy,
                const RopeTables& rotate) {
    return rms_norm_body(x, weight, eps, rounded_copy, rotate, nullptr);
}

SumAndNorm add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                          const Tensor& bias, double eps, Precision rounded_copy) {
    if (!kernel_adds(x, delta)) {
        const Tensor sum = x + delta;
        return {sum, layer_norm(sum, weight, bias, eps, rounded_copy)};
    }
    const ResidualAdd add = residual_add(x, delta);
    const Tensor sum = recorded_sum(add);
    return {sum, layer_norm_body(sum, weight, bias, eps, rounded_copy, {}, &add)};
}

SumAndNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps,
                        Precision rounded_copy) {
    if (!kernel_adds(x, delta)) {
        const Tensor sum = x + delta;
        return {sum, rms_norm(sum, weight, eps, rounded_copy)};
    }
    const ResidualAdd add = residual_add(x, delta);
    const Tensor sum = recorded_sum(add);
    return {sum, rms_norm_body(sum, weight, eps, rounded_copy, {}, &add)};
}

}  // namespace qk
