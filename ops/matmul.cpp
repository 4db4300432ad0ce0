// Matrix multiplication through OpenBLAS GEMM, batched with numpy broadcasting.
//
// Forward, for every batch index β (a and b are read at the batch index that broadcasts to β):
//     y[β, i, j] = Σ_k a[β, i, k] · b[β, k, j]          a: (..., M, K),  b: (..., K, N),
//                                                       y: (..., M, N)
// Saved: b when a requires grad (dA needs it), a when b requires grad (dB needs it); nothing else.
//
// Backward, with dY = ∂L/∂y:
//     ∂L/∂a[β, i, k] = Σ_j dY[β, i, j] · b[β, k, j]   =>   dA = dY · bᵀ    (..., M, N)·(..., N, K)
//     ∂L/∂b[β, k, j] = Σ_i a[β, i, k] · dY[β, i, j]   =>   dB = aᵀ · dY    (..., K, M)·(..., M, N)
// and, as for every broadcasting op, each is then summed over the batch dims its input was
// broadcast along (an input matrix shared by several batches fed all of them):
//     dA = sum_to(dY · bᵀ, a.shape)        dB = sum_to(aᵀ · dY, b.shape)
// Both products are matmuls on transposed views, so the backward is this same forward with the
// transpose flags flipped: nothing is copied. Each gradient is made in its input's layout: for an
// input that is a transposed view (W.t() in x · W.t(), kᵀ in q · kᵀ) the product is computed
// transposed, dBᵀ = dYᵀ · a, so the view's backward hands its base a contiguous gradient, which
// a leaf keeps and an accumulation adds in place, instead of a transposed one it must copy.
//
// Memory layout. GEMM reads a (rows, cols) matrix with strides (ld, 1) as row-major ("N") and one
// with strides (1, ld), i.e. a transposed view, as the transpose of a row-major matrix ("T"), with
// leading dimension ld either way. Only a matrix that is neither (e.g. expanded along its rows) is
// copied, once, with contiguous(). Batch dims are walked with per-batch pointer offsets (stride 0
// where broadcast), so an expanded batch dim is never materialised.
//
// The Linear case, x: (B, T, C) times a 2-D weight, is one (B·T, C) GEMM rather than B small ones
// whenever x's batch and row dims merge into one strided dim; its dB = xᵀ · dY is likewise one
// GEMM with inner dim B·T instead of B GEMMs and a sum.
//
// linear(x, W, b) = x · Wᵀ + b, a Linear layer as one op, W: (N, K) as nanoGPT stores it:
//     y[.., n] = Σ_k x[.., k] · W[n, k] + b[n]                                  saves x, W
// Backward, over the rows r of x flattened to (R, K) and dY to (R, N):
//     dx = dY · W        dW = dYᵀ · x        db[n] = Σ_r dY[r, n]
// Why one op and not matmul(x, W.t()) + b: the bias is written into y first and GEMM adds the
// product onto it (beta = 1), where the two-op form has GEMM clear y, then reads y back and writes
// a second tensor for the sum; and dW comes out as a row-major (N, K) matrix, W's own layout.
//
// Mixed precision (Precision::bf16, float32 tensors only): the same three GEMMs on bfloat16
// operands with float32 accumulation (ops/gemm_bf16.cpp),
//     y = b + x̃ · W̃ᵀ        dx = dỸ · W̃        dW = dỸᵀ · x̃        db = Σ_r dY
// where ˜ marks a value rounded to bf16; the op saves x̃ and W̃ (bf16) instead of x and W. The
// rounding is treated as the identity in the backward (the straight-through rule of every
// mixed-precision trainer): dx and dW are the gradients at the rounded point, computed in float32.
//
// Kernel ladder: v1, the naive triple loop that mirrors the sum above, is the reference in
// tests/test_matmul.cpp; v2 is OpenBLAS, faster because it blocks for the caches and registers
// (packed panels, an AVX-512 micro-kernel) so each loaded element is reused many times.
//
// Threads: a large GEMM is split over the library's pool, small batched ones go to the threads
// whole, and linear's dx and dW run side by side: see ops/gemm.h.
//
// Files: this one holds matmul and linear; ops/matmul_layout.cpp, how GEMM reads a tensor's
// memory (the layouts, the batch strides, the merged rows); ops/matmul_bf16.cpp, linear's
// mixed-precision path, and ops/matmul_batched_bf16.cpp, matmul's; ops/matmul_internal.h declares
// what they share.
#include "ops/matmul.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <tuple>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/strided.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/glu.h"
#include "ops/matmul_internal.h"
#include "ops/on_device.h"
#include "ops/reduce.h"

namespace qk {

#ifdef QK_WITH_CUDA
namespace {
// The device twin of cpu::batched_gemm: one strided-batched cuBLAS call per run of the batch
// (for_each_batch_run, ops/matmul_internal.h).
template <class T>
void cuda_batched_gemm(T* y, const T* a, const Shape& a_batch_strides, cpu::GemmLayout la,
                       const T* b, const Shape& b_batch_strides, cpu::GemmLayout lb,
                       const Shape& batch, int64_t M, int64_t N, int64_t K) {
    matmul_impl::for_each_batch_run(
        batch, M * N, a_batch_strides, b_batch_strides, [&](const matmul_impl::BatchRun& r) {
            cuda::gemm(y + r.y, N, r.stride_y, a + r.a, la.trans, la.ld, r.stride_a, b + r.b,
                       lb.trans, lb.ld, r.stride_b, M, N, K, r.count, T(0));
        });
}
}  // namespace
#endif

using namespace matmul_impl;

namespace {

void check_args(const Tensor& a, const Tensor& b) {
    QK_CHECK(a.defined() && b.defined(), "matmul: got an undefined tensor");
    QK_CHECK(a.dim() >= 2 && b.dim() >= 2,
             "matmul: needs inputs of rank >= 2, got a {} (rank {}) and b {} (rank {})", a.shape(),
             a.dim(), b.shape(), b.dim());
    QK_CHECK(is_compute_dtype(a.dtype()) && is_compute_dtype(b.dtype()),
             "matmul: needs float32 or float64 inputs, got a {} {} and b {} {}", a.dtype(),
             a.shape(), b.dtype(), b.shape());
    QK_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ: a is {} {}, b is {} {}", a.dtype(),
             a.shape(), b.dtype(), b.shape());
    QK_CHECK(a.device() == b.device(), "matmul: devices differ: a is on {}, b is on {}", a.device(),
             b.device());
    QK_CHECK(
        a.size(-1) == b.size(-2),
        "matmul: inner dimensions differ: a is {}, b is {} (expected a.shape[-1] == b.shape[-2])",
        a.shape(), b.shape());
    for (int64_t i = 1; i <= std::min(a.dim(), b.dim()) - 2; ++i) {
        const int64_t sa = a.size(-2 - i), sb = b.size(-2 - i);
        QK_CHECK(sa == sb || sa == 1 || sb == 1,
                 "matmul: batch dims do not broadcast: a is {}, b is {} (sizes {} and {} at batch "
                 "dim -{})",
                 a.shape(), b.shape(), sa, sb, i);
    }
    for (int64_t n : {a.size(-2), a.size(-1), b.size(-1)})
        QK_CHECK(n <= INT_MAX, "matmul: a {} times b {} has a dim above BLAS's int range",
                 a.shape(), b.shape());
}

// Whether t's batch dims (its own, under the broadcast `batch`) step evenly, so that they merge
// into one strided batch: each outer stride is the inner one times the inner size. A broadcast
// operand (stride 0 on a dim of `batch`) counts as even: copying it would materialise the
// broadcast. On cuda an uneven operand (the heads of a (B, T, H, D) tensor viewed as (B, H, T, D),
// attention's dO in backward) is copied once so that cuBLAS gets all B·H matrices in one call:
// 12 at a time left most of an H200 idle (26 against 45 TFLOP/s, 10 ms of a 124M-shaped step).
bool batch_steps_evenly(const Tensor& t, const Shape& batch) {
    const Shape strides = batch_strides(t, batch);
    for (size_t d = 1; d < batch.size(); ++d) {
        if (batch[d - 1] == 1 || batch[d] == 1) continue;
        if (strides[d - 1] == 0 || strides[d] == 0) return true;
        if (strides[d - 1] != strides[d] * batch[d]) return false;
    }
    return true;
}

// The forward without autograd: y = a · b into a fresh contiguous tensor.
Tensor matmul_forward(const Tensor& a_in, const Tensor& b_in) {
    const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
    const Shape batch = broadcast_shapes(batch_of(a_in), batch_of(b_in), "matmul");
    Shape out_shape = batch;
    out_shape.insert(out_shape.end(), {M, N});
    if (numel_of(out_shape) == 0) return Tensor::empty(out_shape, a_in.dtype(), a_in.device());
    if (K == 0) return zeros(out_shape, a_in.dtype(), a_in.device());  // an empty sum
    Tensor y = Tensor::empty(out_shape, a_in.dtype(), a_in.device());

    auto [a, la] = gemm_operand(a_in);
    auto [b, lb] = gemm_operand(b_in);
    // On cuda, one cuBLAS call for the whole batch where a copy buys it.
    if (a_in.device() == Device::cuda) {
        if (!batch_steps_evenly(a, batch)) std::tie(a, la) = gemm_operand(a.detach().contiguous());
        if (!batch_steps_evenly(b, batch)) std::tie(b, lb) = gemm_operand(b.detach().contiguous());
    }
    // The Linear case: one matrix b shared by every batch, a's rows stacked at one stride.
    const bool one_gemm = numel_of(batch_of(b)) == 1 && !la.trans && rows_merge(a, la.ld) &&
                          numel_of(batch) * M <= INT_MAX;
    on_device(
        "matmul", y.device(), y.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            if (one_gemm)
                cpu::gemm(cpu::GemmJob<T, T>{y.data<T>(), N, a.data<T>(), la, b.data<T>(), lb,
                                             numel_of(batch) * M, N, K});
            else
                cpu::batched_gemm(y.data<T>(), a.data<T>(), batch_strides(a, batch), la,
                                  b.data<T>(), batch_strides(b, batch), lb, batch, M, N, K);
        },
        [&](auto tag) {
            using T = decltype(tag);
            if (one_gemm)
                cuda::gemm(y.data<T>(), N, 0, a.data<T>(), la.trans, la.ld, 0, b.data<T>(),
                           lb.trans, lb.ld, 0, numel_of(batch) * M, N, K, 1, T(0));
            else
                cuda_batched_gemm(y.data<T>(), a.data<T>(), batch_strides(a, batch), la,
                                  b.data<T>(), batch_strides(b, batch), lb, batch, M, N, K);
        });
    return y;
}

// dB = sum_to(aᵀ · dY, b.shape). When b is one matrix shared by every batch (the Linear case),
// the batch sum folds into the GEMM's inner dim: dB = a_rowsᵀ · dY_rows, (K, B·M)·(B·M, N).
// trans (b is a transposed view): dB = (dYᵀ · a)ᵀ, the transposed view of a row-major product.
Tensor grad_b(const Tensor& a, const Tensor& dy, const Shape& b_shape, bool trans) {
    const bool shared_b = numel_of(Shape(b_shape.begin(), b_shape.end() - 2)) == 1;
    if (shared_b && dy.dim() > 2) {
        const Tensor a_rows = as_rows(a), dy_rows = as_rows(dy);
        Tensor db = trans ? matmul(dy_rows.t(), a_rows).t() : matmul(a_rows.t(), dy_rows);
        return db.reshape(b_shape);  // a view: b_shape only adds leading 1s
    }
    Tensor db =
        trans ? matmul(dy.transpose(-2, -1), a).transpose(-2, -1) : matmul(a.transpose(-2, -1), dy);
    return sum_to(db, b_shape);
}

// dA = sum_to(dY · bᵀ, a.shape), in a's layout like grad_b: (b · dYᵀ)ᵀ when a is transposed.
Tensor grad_a(const Tensor& b, const Tensor& dy, const Shape& a_shape, bool trans) {
    Tensor da =
        trans ? matmul(b, dy.transpose(-2, -1)).transpose(-2, -1) : matmul(dy, b.transpose(-2, -1));
    return sum_to(da, a_shape);
}

// Linear's dx = dY · W and dW = dYᵀ · x as one cpu::gemm_pair.
// dy_rows: (R, N); x_rows: (R, K); w: (N, K).    Returns dx: (R, K), dW: (N, K).
std::pair<Tensor, Tensor> cpu_linear_grads(const Tensor& dy_rows, const Tensor& x_rows,
                                           const Tensor& w) {
    const int64_t R = dy_rows.size(0), N = w.size(0), K = w.size(1);
    if (R == 0 || N == 0 || K == 0)  // an empty product: matmul writes its zeros
        return {matmul(dy_rows, w), matmul(dy_rows.t(), x_rows)};
    Tensor dx = Tensor::empty({R, K}, w.dtype(), w.device());
    Tensor dw = Tensor::empty({N, K}, w.dtype(), w.device());
    auto [dy_n, l_dy] = gemm_operand(dy_rows);       // dY as stored: (R, N)
    auto [dy_t, l_dyt] = gemm_operand(dy_rows.t());  // dYᵀ: the same memory, read transposed
    auto [x, lx] = gemm_operand(x_rows);
    auto [wm, lw] = gemm_operand(w);
    dispatch_float(w.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::gemm_pair(cpu::GemmJob<T, T>{dx.data<T>(), K, dy_n.template data<T>(), l_dy,
                                          wm.template data<T>(), lw, R, K, N},
                       cpu::GemmJob<T, T>{dw.data<T>(), K, dy_t.template data<T>(), l_dyt,
                                          x.template data<T>(), lx, N, K, R});
    });
    return {dx, dw};
}

}  // namespace

// A bfloat16 weight (stored so for inference) is read by the bf16 GEMMs only, with float32 x and
// bias.
void matmul_impl::check_linear_args(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    Precision precision) {
    QK_CHECK(x.defined() && weight.defined(), "linear: got an undefined x or weight");
    QK_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
             "linear: x is {}, weight is {} (expected weight (out_features, {}))", x.shape(),
             weight.shape(), x.dim() >= 1 ? x.size(-1) : 0);
    const bool bf16_weight = weight.dtype() == kBF16 && precision == Precision::bf16;
    QK_CHECK(is_compute_dtype(x.dtype()) && (x.dtype() == weight.dtype() || bf16_weight),
             "linear: needs float32 or float64 x and weight of one dtype (or a bfloat16 weight "
             "at bf16 precision), got x {} {} and weight {} {} at precision {}",
             x.dtype(), x.shape(), weight.dtype(), weight.shape(), precision_name(precision));
    QK_CHECK(x.device() == weight.device(), "linear: x is on {}, weight on {}", x.device(),
             weight.device());
    QK_CHECK(weight.size(0) <= INT_MAX && weight.size(1) <= INT_MAX,
             "linear: weight {} has a dim above BLAS's int range", weight.shape());
    if (!bias.defined()) return;
    QK_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0) && bias.dtype() == x.dtype() &&
                 bias.device() == weight.device(),
             "linear: bias is {} {}, expected {} [{}] for weight {}", bias.dtype(), bias.shape(),
             x.dtype(), weight.size(0), weight.shape());
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
              Precision precision) {
    check_linear_args(x_in, weight_in, bias_in, precision);
    QK_CHECK(precision != Precision::fp8,
             "linear: fp8 precision needs the layer's scaling state: call linear_fp8 "
             "(ops/fp8.h) with x {} and weight {}",
             x_in.shape(), weight_in.shape());
    if (precision == Precision::bf16) return linear_bf16(x_in, weight_in, bias_in);
    if (precision == Precision::fp16) return linear_fp16(x_in, weight_in, bias_in);
    const Tensor x = autograd::saved(x_in), weight = autograd::saved(weight_in);
    const int64_t K = weight.size(1), N = weight.size(0);
    const int64_t R = numel_of(Shape(x.shape().begin(), x.shape().end() - 1));  // rows of x
    QK_CHECK(R <= INT_MAX, "linear: x {} has more rows than BLAS's int range", x.shape());
    Shape out_shape = x.shape();
    out_shape.back() = N;
    Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
    const Tensor b = autograd::contiguous_input(bias_in);
    on_device(
        "linear", y.device(), y.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            T* yp = y.data<T>();
            if (R * N == 0) return;
            if (K == 0 && !b.defined()) {  // an empty sum and no bias: 0
                std::fill_n(yp, R * N, T(0));
                return;
            }
            auto [a, la] = gemm_operand(rows_of(x));  // (R, K): a view if rows merge
            auto [w, lw] = gemm_operand(weight.t());  // (K, N): W read transposed
            // y = b in every row, then += x · Wᵀ (each thread on its own slab)
            cpu::gemm(cpu::GemmJob<T, T>{yp, N, a.template data<T>(), la, w.template data<T>(), lw,
                                         R, N, K, T(0),
                                         b.defined() ? b.template data<T>() : nullptr});
        },
        [&](auto tag) {
            using T = decltype(tag);
            if (R * N == 0) return;
            if (b.defined())  // y = b in every row (a broadcast copy), then += x · Wᵀ
                copy_into(make_view(y, {R, N}, {N, 1}, 0), b.expand({R, N}));
            if (K == 0) {  // an empty sum: y is the bias, or 0
                if (!b.defined()) cuda::fill(y.raw_data(), y.dtype(), R * N, 0.0);
                return;
            }
            auto [a, la] = gemm_operand(rows_of(x));
            auto [w, lw] = gemm_operand(weight.t());
            cuda::gemm(y.data<T>(), N, 0, a.template data<T>(), la.trans, la.ld, 0,
                       w.template data<T>(), lw.trans, lw.ld, 0, R, N, K, 1,
                       b.defined() ? T(1) : T(0));
        });
    const bool need_x = x_in.requires_grad(), need_w = weight_in.requires_grad();
    const bool need_b = bias_in.defined() && bias_in.requires_grad();
    auto backward = [need_x, need_w, need_b, N, x_shape = x.shape(),
                     x_saved = need_w ? autograd::saved(x) : Tensor(),
                     w_saved = need_x ? autograd::saved(weight) : Tensor()](const Tensor& dy) {
        const Tensor dy_rows = rows_of(dy);  // (R, N)
        Tensor dx, dw, db;
        if (need_x && need_w && dy.device() == Device::cpu) {
            std::tie(dx, dw) = cpu_linear_grads(dy_rows, rows_of(x_saved), w_saved);
            dx = dx.reshape(x_shape);
        } else {
            if (need_x) dx = matmul(dy_rows, w_saved).reshape(x_shape);  // dY · W
            if (need_w) dw = matmul(dy_rows.t(), rows_of(x_saved));      // dYᵀ · x
        }
        if (need_b) db = sum_to(dy_rows, {N});  // Σ_r dY
        return std::vector<Tensor>{dx, dw, db};
    };
    return autograd::record("linear", y, {x_in, weight_in, bias_in}, std::move(backward));
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, Precision precision,
                   Precision rounded_copy) {
    check_linear_args(x, weight, bias, precision);
    if (precision == Precision::bf16) return linear_gelu_bf16(x, weight, bias, rounded_copy);
    if (precision == Precision::fp16) return linear_gelu_fp16(x, weight, bias, rounded_copy);
    return gelu(linear(x, weight, bias, precision), rounded_copy);
}

namespace {

// The MLP ops' second Linear: w_proj (out, hidden) reads the first's `hidden` outputs.
void check_projection(const char* op, const Tensor& x, const Tensor& w_first, const Tensor& w_proj,
                      const Tensor& b_proj) {
    QK_CHECK(w_proj.defined() && w_proj.dim() == 2 && w_proj.size(1) == w_first.size(0) &&
                 w_proj.dtype() == w_first.dtype() && w_proj.device() == w_first.device(),
             "{}: w_proj must be a {} (out_features, {}) on {} to read the {} outputs of {}, got "
             "{} {} on {}",
             op, w_first.dtype(), w_first.size(0), w_first.device(), w_first.size(0),
             w_first.shape(), w_proj.defined() ? w_proj.dtype() : w_first.dtype(), w_proj.shape(),
             w_proj.defined() ? w_proj.device() : w_first.device());
    QK_CHECK(!b_proj.defined() || (b_proj.dim() == 1 && b_proj.size(0) == w_proj.size(0) &&
                                   b_proj.dtype() == x.dtype() && b_proj.device() == x.device()),
             "{}: b_proj is {} {}, expected {} [{}] for w_proj {}", op, b_proj.dtype(),
             b_proj.shape(), x.dtype(), w_proj.size(0), w_proj.shape());
}

// Whether an MLP op runs as one node: float32 x on cuda at bf16 / fp16, its first Linear (w, b)
// not on a padded width.
bool one_mlp_node(const Tensor& x, const Tensor& w, const Tensor& b, Precision precision) {
    return x.device() == Device::cuda && x.dtype() == kF32 &&
           rounded_copy_for_gemm(precision) != Precision::full && !linear_pads_width(x, w, b);
}

}  // namespace

Tensor linear_gelu_linear(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                          const Tensor& w_proj, const Tensor& b_proj, Precision precision) {
    check_linear_args(x, w_fc, b_fc, precision);
    check_projection("linear_gelu_linear", x, w_fc, w_proj, b_proj);
    if (one_mlp_node(x, w_fc, b_fc, precision))
        return precision == Precision::bf16
                   ? linear_gelu_linear_bf16(x, w_fc, b_fc, w_proj, b_proj)
                   : linear_gelu_linear_fp16(x, w_fc, b_fc, w_proj, b_proj);
    const Tensor h = linear_gelu(x, w_fc, b_fc, precision, rounded_copy_for_gemm(precision));
    return linear(h, w_proj, b_proj, precision);
}

Tensor glu_linear(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& w_proj,
                  const Tensor& b_proj, GluActivation activation, Precision precision) {
    check_linear_args(x, w_gate, {}, precision);
    check_linear_args(x, w_up, {}, precision);
    QK_CHECK(w_up.shape() == w_gate.shape(),
             "glu_linear: w_gate {} and w_up {} must have the same shape", w_gate.shape(),
             w_up.shape());
    check_projection("glu_linear", x, w_gate, w_proj, b_proj);
    if (one_mlp_node(x, w_gate, {}, precision))
        return precision == Precision::bf16
                   ? glu_linear_bf16(x, w_gate, w_up, w_proj, b_proj, activation)
                   : glu_linear_fp16(x, w_gate, w_up, w_proj, b_proj, activation);
    const Tensor h = glu(linear(x, w_gate, {}, precision), linear(x, w_up, {}, precision),
                         activation, rounded_copy_for_gemm(precision));
    return linear(h, w_proj, b_proj, precision);
}

namespace {
std::atomic<bool> tf32_on{false};
}

void set_tf32(bool on) {
#ifdef QK_WITH_CUDA
    cuda::set_tf32_math(on);
#endif
    tf32_on = on;
}
bool tf32_enabled() { return tf32_on; }

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
    check_args(a_in, b_in);
    const Tensor a = autograd::saved(a_in), b = autograd::saved(b_in);  // read as they are
    Tensor y = matmul_forward(a, b);
    // Save only what the backward reads: b for dA, a for dB (and only for inputs wanting grad),
    // and whether each input is a transposed view (its gradient is made in the same layout).
    const bool need_a = a_in.requires_grad(), need_b = b_in.requires_grad();
    auto backward = [need_a, need_b, a_saved = need_b ? autograd::saved(a) : Tensor(),
                     b_saved = need_a ? autograd::saved(b) : Tensor(), a_shape = a.shape(),
                     b_shape = b.shape(), a_trans = stored_transposed(a),
                     b_trans = stored_transposed(b)](const Tensor& dy) {
        Tensor da, db;
        if (need_a) da = grad_a(b_saved, dy, a_shape, a_trans);  // dY · bᵀ
        if (need_b) db = grad_b(a_saved, dy, b_shape, b_trans);  // aᵀ · dY
        return std::vector<Tensor>{da, db};
    };
    return autograd::record("matmul", y, {a_in, b_in}, std::move(backward));
}

Tensor matmul(const Tensor& a, const Tensor& b, Precision precision, double alpha) {
    check_args(a, b);
    QK_CHECK(std::isfinite(alpha), "matmul: alpha must be finite, got {} (a {}, b {})", alpha,
             a.shape(), b.shape());
    switch (precision) {
        case Precision::full:
            return alpha == 1.0 ? matmul(a, b) : matmul(a, b) * alpha;
        case Precision::bf16:
            return matmul_bf16(a, b, static_cast<float>(alpha));
        case Precision::fp16:
            return matmul_fp16(a, b, static_cast<float>(alpha));
        case Precision::fp8:
            break;
    }
    throw Error(
        fmt::format("matmul: fp8 precision applies to Linear layers (linear_fp8); a {} "
                    "times b {} takes full, bf16 or fp16",
                    a.shape(), b.shape()));
}

namespace detail {

Tensor matmul_tiled(const Tensor& a_in, const Tensor& b_in) {
    QK_CHECK(a_in.device() == Device::cuda && b_in.device() == Device::cuda,
             "matmul_tiled: needs cuda tensors, got a on {} and b on {}", a_in.device(),
             b_in.device());
    QK_CHECK((a_in.dim() == 2 || a_in.dim() == 3) && a_in.dim() == b_in.dim() &&
                 a_in.dtype() == b_in.dtype() && is_compute_dtype(a_in.dtype()) &&
                 a_in.size(-1) == b_in.size(-2) &&
                 (a_in.dim() == 2 || a_in.size(0) == b_in.size(0)),
             "matmul_tiled: needs float a (M, K) and b (K, N), or (B, M, K) and (B, K, N), of one "
             "dtype; got a {} {} and b {} {}",
             a_in.dtype(), a_in.shape(), b_in.dtype(), b_in.shape());
    const Tensor a = autograd::contiguous_input(a_in), b = autograd::contiguous_input(b_in);
    const int64_t batch = a.dim() == 3 ? a.size(0) : 1;
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    Shape out_shape = a.shape();
    out_shape.back() = N;
    Tensor y = Tensor::empty(out_shape, a.dtype(), a.device());
#ifdef QK_WITH_CUDA
    dispatch_float(a.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cuda::matmul_tiled(y.data<T>(), a.data<T>(), b.data<T>(), batch, M, N, K);
    });
#else
    (void)batch, (void)M, (void)K, (void)N;
    throw_built_without_cuda("matmul_tiled");
#endif
    return y;
}

}  // namespace detail

}  // namespace qk
