// linear with Precision::bf16 or fp16: the forward GEMM and the two backward GEMMs (dx, dW) on
// bfloat16 or float16 operands with float32 accumulation, the bias, the result and every gradient
// in float32:
//     y = b + x̃ · W̃ᵀ        dx = dỸ · W̃        dW = dỸᵀ · x̃        db = Σ_r dY
// with ˜ a value rounded to the half type (the math, and why the rounding counts as the identity in
// the backward, are in ops/matmul.cpp). The GEMMs are ops/gemm_bf16.cpp on the cpu and
// cuda::gemm_mixed (cuBLAS) on the device, or with a bias cuda::linear_bias_mixed (cuBLASLt, b
// added in the GEMM's epilogue). float16 overflows where bfloat16 does not: x, W or dY beyond
// 65,504 becomes Inf here, which is what a loss scaler watches for (nn/optim/loss_scale.h).
//
// linear_gelu, h = gelu(y) of the same y, is one node on cuda: GELU's backward dY = dH ⊙ gelu'(Y)
// is what the linear's backward rounds and sums next, so one pass makes dỸ and db from dH and Y,
// and dY never lands in memory in float32.
#include <algorithm>
#include <climits>
#include <tuple>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/factory.h"
#include "ops/elementwise.h"
#include "ops/elementwise_math.h"
#include "ops/gemm.h"
#include "ops/glu.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"
#include "ops/reduce.h"
#include "ops/rounded_copy.h"

namespace qk::matmul_impl {

namespace {

// t = 0 on its device (t contiguous).
void fill_zeros(const Tensor& t) {
    if (t.device() == Device::cpu) {
        std::fill_n(t.data<float>(), t.numel(), 0.0f);
        return;
    }
#ifdef QK_WITH_CUDA
    cuda::fill(t.raw_data(), t.dtype(), t.numel(), 0.0);
#endif
}

// cuBLAS's tensor-core GEMMs run 3–5× slower when a dimension is not a multiple of 8: on an H200
// the vocabulary head's three (16,384 × 50,257 × 768 and its gradients) took 13.2, 8.9 and 8.3 ms
// where aligned shapes of the same work take ~2.6, whatever the row strides (padding only those
// sped up one of the three). As llm.c pads GPT-2's vocabulary to 50,304, a cuda Linear whose
// output width N is not a multiple of 8 runs its GEMMs N′ = N rounded up to 64 wide: the weight's
// rounding gets N′ − N zero rows, y is computed N′ wide and is the view of its N columns (rows N′
// apart: cross_entropy reads them in place), and dỸ gets N′ − N zero columns. The zeros add
// nothing to any sum: the same sums (cuBLAS may split them differently for N′, so the last bits
// can differ). The padded weight is a copy made per call (~6·N·K bytes), which pays when the time
// saved, 2·R·N·K FLOPs at three quarters of the rate, exceeds it: above R ≈ 200 rows on an H200.
// kPadRows keeps decoding (R = batch), where the product is a read of the weight, well clear of
// that. The cost in memory: y's rows hold N′ − N floats more than its values (0.1 % at GPT-2's
// vocabulary).
constexpr int64_t kPadTo = 64, kPadRows = 1024;
bool pads_width(Device device, int64_t R, int64_t N) {
    return device == Device::cuda && N % 8 != 0 && R >= kPadRows;
}

// m: a matrix -> the same values followed by zeros along dim, its size rounded up to kPadTo: the
// weight's (N′, K) rows, dỸ's (R, N′) columns. Only the padding is zeroed (a zero fill of the
// whole would write dỸ's R·N′ values twice).
Tensor zero_padded(const Tensor& m, int dim) {
    const int64_t n = m.size(dim), n_padded = (n + kPadTo - 1) / kPadTo * kPadTo;
    Shape shape = m.shape();
    shape[size_t(dim)] = n_padded;
    const Tensor padded = Tensor::empty(shape, m.dtype(), m.device());
    copy_into(padded.narrow(dim, 0, n), m);
    if (n_padded > n) {
        const Tensor padding = padded.narrow(dim, n, n_padded - n);
        copy_into(padding, zeros({}, m.dtype(), m.device()).expand(padding.shape()));
    }
    return padded;
}

#ifdef QK_WITH_CUDA
// y = b in every row, in one launch. y: (R, N) contiguous; b: (N).
void fill_bias_rows(const Tensor& y, const Tensor& b) {
    cuda::fill_bias_rows(y.data<float>(), b.data<float>(), y.size(0), y.size(1));
}

// dỸ = round(dY) as a new (R, N) Half tensor, and db = Σ_r dY (N) when want_db, from one read
// of dy: (R, N). With gelu_in, GELU's input (R, N) contiguous, dy is dH and dY = dH ⊙ gelu'(Y).
template <class Half>
std::pair<Tensor, Tensor> round_and_sum_columns(const Tensor& dy, bool want_db = true,
                                                const Tensor& gelu_in = {}) {
    const int64_t R = dy.size(0), N = dy.size(1);
    Tensor dy_half = Tensor::empty({R, N}, dtype_of<Half>(), dy.device());
    Tensor db = want_db ? Tensor::empty({N}, kF32, dy.device()) : Tensor();
    cuda::round_and_sum_columns(dy_half.data<Half>(), want_db ? db.data<float>() : nullptr,
                                dy.data<float>(), dy.strides()[0], R, N,
                                gelu_in.defined() ? gelu_in.data<float>() : nullptr);
    return {dy_half, db};
}
#else
void fill_bias_rows(const Tensor&, const Tensor&) { throw_built_without_cuda("linear"); }
template <class Half>
std::pair<Tensor, Tensor> round_and_sum_columns(const Tensor&, bool = true, const Tensor& = {}) {
    throw_built_without_cuda("linear");
}
#endif

// A (rows, cols) matrix's row stride, for BLAS: a single row's stride is arbitrary (a view may
// carry any), and BLAS wants at least cols.
int64_t row_stride(const Tensor& t) { return t.size(0) <= 1 ? t.size(1) : t.strides()[0]; }

// The job y = op(a) · op(b) (+ bias) on (rows, cols) matrices whose rows are contiguous, each read
// with its own row stride.
template <class Half>
cpu::GemmJob<Half, float> half_job(const Tensor& y, const Tensor& a, bool a_trans, const Tensor& b,
                                   bool b_trans, const Tensor& bias = {}) {
    const int64_t M = y.size(0), N = y.size(1), K = a_trans ? a.size(0) : a.size(1);
    return {y.data<float>(),
            row_stride(y),
            a.data<Half>(),
            {a_trans, row_stride(a)},
            b.data<Half>(),
            {b_trans, row_stride(b)},
            M,
            N,
            K,
            0.0f,
            bias.defined() ? bias.data<float>() : nullptr};
}

// One mixed-precision GEMM on the tensors' device (the job's pointers are device pointers for
// cuda). cuBLAS has no bias argument: on cuda the caller writes the bias into y first and sets
// beta = 1.
template <class Half>
void half_gemm(cpu::GemmJob<Half, float> job, Device device) {
    switch (device) {
        case Device::cpu:
            cpu::gemm(job);
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            QK_CHECK(!job.bias, "linear: internal: a bias pointer reached the cuda mixed GEMM");
            cuda::gemm_mixed(job.y, job.ldy, 0, job.a, job.la.trans, job.la.ld, 0, job.b,
                             job.lb.trans, job.lb.ld, 0, job.M, job.N, job.K, 1, job.alpha,
                             job.beta);
#else
            throw_built_without_cuda("linear");
#endif
            break;
    }
}

// y = x̃ · W̃ᵀ + b on cuda, in one cuBLASLt call that adds b in its epilogue; where cuBLASLt has
// no algorithm for the shape (or a test turned it off), b goes into y first and the GEMM adds to
// it (beta = 1). y: (R, N) contiguous; x_half: (R, K); w_half: (N, K) contiguous; b: (N).
template <class Half>
void gemm_with_bias(const Tensor& y, const Tensor& x_half, const Tensor& w_half, const Tensor& b) {
#ifdef QK_WITH_CUDA
    const int64_t R = y.size(0), N = y.size(1), K = x_half.size(1);
    if (x_half.is_contiguous() &&
        cuda::linear_bias_mixed(y.data<float>(), x_half.data<Half>(), w_half.data<Half>(),
                                b.data<float>(), R, N, K))
        return;
#endif
    fill_bias_rows(y, b);
    auto job = half_job<Half>(y, x_half, false, w_half, true);
    job.beta = 1.0f;
    half_gemm<Half>(job, Device::cuda);
}

// What a mixed linear's backward keeps from its forward, and its gradients:
//     dx = dỸ · W̃        dW = dỸᵀ · x̃        db = Σ_r dY
// from dY (operator(): rounded, and summed for db in the same pass on cuda) or from a dỸ and db
// that the caller's own pass made (linear_gelu's, which applies GELU's derivative first).
template <class Half>
struct MixedLinearBackward {
    bool need_x = false, need_w = false, need_b = false;
    int64_t R = 0, N = 0, K = 0;
    Device device = Device::cpu;
    bool padded = false;
    Shape x_shape;
    Tensor x_saved, w_saved;  // x̃ when dW is wanted, W̃ when dx is
    uint64_t w_version = 0;
    std::shared_ptr<Storage> w_storage;

    // The weight's kept rounding is rewritten in place by the optimizer: a backward after a step
    // would read the new weights where the forward read the old. A padded copy is the forward's
    // own and would still be right, but a write to the weight between the two is refused there
    // too, as on the unpadded path after an optimizer step.
    void check_weight_unchanged() const {
        QK_CHECK(!need_x || (!padded && w_storage->cast_copy().storage != w_saved.storage()) ||
                     w_storage->version() == w_version,
                 "linear: backward after the weight {} was written (an optimizer step or an "
                 "in-place edit between this forward and its backward); run the forward again",
                 Shape{N, K});
    }

    std::vector<Tensor> operator()(const Tensor& dy) const {
        check_weight_unchanged();
        const Tensor dy_rows = rows_of(dy);  // (R, N)
        Tensor db, dy_rounded;
        if (need_b && (need_x || need_w) && device == Device::cuda)  // one read of dY for both
            std::tie(dy_rounded, db) = round_and_sum_columns<Half>(dy_rows);
        else if (need_x || need_w)  // kept beside dY when its producer rounded it (glu)
            dy_rounded = cast_once(dy_rows, dtype_of<Half>());
        if (need_b && !db.defined()) db = sum_to(dy_rows, {N});  // Σ_r dY, in float32
        return gradients(dy_rounded, db);
    }

    // dy_rounded: (R, N) Half, defined when dx or dW is wanted; db: (N), defined when wanted.
    std::vector<Tensor> gradients(Tensor dy_rounded, const Tensor& db) const {
        // Padded: dỸ gets the zero columns that meet the weight's zero rows in dx (unless it came
        // padded: linear_cross_entropy's); dW reads its N columns (a dimension of N with aligned
        // rows ran at full speed, measured).
        if (padded && dy_rounded.defined() && dy_rounded.size(1) == N)
            dy_rounded = zero_padded(dy_rounded, 1);
        const Tensor dy_n =
            padded && dy_rounded.defined() ? dy_rounded.narrow(1, 0, N) : dy_rounded;
        Tensor dx = need_x ? Tensor::empty({R, K}, kF32, device) : Tensor();
        Tensor dw = need_w ? Tensor::empty({N, K}, kF32, device) : Tensor();
        if (R * N * K > 0) {
            if (need_x && need_w && device == Device::cpu)
                cpu::gemm_pair(half_job<Half>(dx, dy_rounded, false, w_saved, false),  // dỸ · W̃
                               half_job<Half>(dw, dy_rounded, true, x_saved, false));  // dỸᵀ · x̃
            else {
                if (need_x)
                    half_gemm<Half>(half_job<Half>(dx, dy_rounded, false, w_saved, false), device);
                if (need_w) half_gemm<Half>(half_job<Half>(dw, dy_n, true, x_saved, false), device);
            }
        } else {  // an empty sum
            if (need_x) dx = zeros({R, K}, kF32, device);
            if (need_w) dw = zeros({N, K}, kF32, device);
        }
        return std::vector<Tensor>{need_x ? dx.reshape(x_shape) : dx, dw, need_b ? db : Tensor()};
    }
};

template <class Half>
struct MixedLinear {
    Tensor y;  // (..., N) float32
    MixedLinearBackward<Half> backward;
};

// A mixed linear's input: x rounded, as (R, K) rows; x's shape; whether x wants a gradient.
struct HalfInput {
    Tensor rounded;
    Shape shape;
    bool needs_grad = false;
};

// y = x̃ · W̃ᵀ + b, and what its backward keeps; records nothing.
template <class Half>
MixedLinear<Half> mixed_linear_forward(const HalfInput& x, const Tensor& weight_in,
                                       const Tensor& bias_in) {
    const Tensor weight = autograd::saved(weight_in);
    constexpr DType kHalf = dtype_of<Half>();
    // A weight stored as bf16 (inference, nn::GPT::store_weights_bf16) has no float32 master copy
    // for a gradient to update.
    QK_CHECK(weight.dtype() != kHalf || !(weight_in.requires_grad() && autograd::grad_enabled()),
             "linear: a {}-stored weight {} is for inference and takes no gradient (run "
             "the model under NoGradGuard)",
             kHalf, weight.shape());
    const int64_t K = weight.size(1), N = weight.size(0);
    const int64_t R = x.rounded.size(0);
    QK_CHECK(R <= INT_MAX, "linear: x {} has more rows than BLAS's int range", x.shape);
    const Device device = x.rounded.device();
    Shape out_shape = x.shape;
    out_shape.back() = N;
    // The weight's rounding is made once per version of its values and kept (cast_once): in
    // training the optimizer rewrites it in its update, so no call rounds a weight again.
    const Tensor b = autograd::contiguous_input(bias_in);
    // A width cuBLAS runs slowly (above) computes N′ wide against zero rows of the weight: the
    // vocabulary heads, which have no bias (a biased Linear adds it in cuBLASLt's epilogue).
    const bool padded = pads_width(device, R, N) && K > 0 && !b.defined();
    const Tensor w_rounded =
        padded ? zero_padded(cast_once(weight, kHalf), 0) : cast_once(weight, kHalf);
    // Padded, y is the first N columns of the N′-wide rows the GEMM writes: a view with rows N′
    // apart, which cross_entropy (and any kernel that reads strides) reads in place.
    const Tensor y_wide = padded ? Tensor::empty({R, w_rounded.size(0)}, kF32, device) : Tensor();
    const Tensor y =
        padded ? y_wide.narrow(1, 0, N).reshape(out_shape) : Tensor::empty(out_shape, kF32, device);
    const Tensor& x_rounded = x.rounded;
    if (R * N > 0) {
        const Tensor y_rows = y.reshape({R, N});
        if (K == 0) {  // an empty sum: y is the bias, or 0
            if (b.defined())
                copy_into(y_rows, b.expand({R, N}));
            else
                fill_zeros(y_rows);
        } else if (b.defined() && device == Device::cuda) {  // the bias in the GEMM's epilogue
            gemm_with_bias<Half>(y_rows, x_rounded, w_rounded, b);
        } else if (padded) {  // y = x̃ · W̃ᵀ, N′ wide (y views its N columns)
            half_gemm<Half>(half_job<Half>(y_wide, x_rounded, false, w_rounded, true), device);
        } else {  // y = b + x̃ · W̃ᵀ (the cpu writes the bias inside the GEMM's slabs)
            half_gemm<Half>(half_job<Half>(y_rows, x_rounded, false, w_rounded, true, b), device);
        }
    }
    MixedLinearBackward<Half> backward;
    backward.need_x = x.needs_grad;
    backward.need_w = weight_in.requires_grad();
    backward.need_b = bias_in.defined() && bias_in.requires_grad();
    backward.R = R, backward.N = N, backward.K = K;
    backward.device = device;
    backward.padded = padded;
    backward.x_shape = x.shape;
    if (backward.need_w) backward.x_saved = autograd::saved(x_rounded);
    if (backward.need_x) backward.w_saved = autograd::saved(w_rounded);
    backward.w_version = weight.storage()->version();
    backward.w_storage = weight.storage();
    return {y, std::move(backward)};
}

// The same from a float32 x. x is rounded once for every Linear that reads the same x (a gated
// MLP's gate and up: cast_once keeps the rounding beside x's buffer), or arrives rounded already
// (kept beside it by the norm that wrote it).
template <class Half>
MixedLinear<Half> mixed_linear_forward(const Tensor& x_in, const Tensor& weight_in,
                                       const Tensor& bias_in) {
    const Tensor x = autograd::saved(x_in);
    constexpr DType kHalf = dtype_of<Half>();
    QK_CHECK(x.dtype() == kF32, "linear: {} precision needs float32 x and weight, got {} {}",
             kHalf == kBF16 ? "bf16" : "fp16", x.dtype(), x.shape());
    return mixed_linear_forward<Half>(
        HalfInput{cast_once(rows_of(x), kHalf), x.shape(), x_in.requires_grad()}, weight_in,
        bias_in);
}

template <class Half>
Tensor linear_mixed(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    MixedLinear<Half> linear = mixed_linear_forward<Half>(x, weight, bias);
    return autograd::record("linear", linear.y, {x, weight, bias}, std::move(linear.backward));
}

// h = gelu(x̃ · W̃ᵀ + b) as one node. Forward: the linear, then GELU (writing h's rounding for the
// next Linear when asked); it saves y for GELU's derivative. Backward on cuda: dY = dH ⊙ gelu'(Y)
// rounded to dỸ and summed for db in one pass (cuda::round_and_sum_columns with gelu_in), where
// the two ops' nodes write dY in float32 and read it again; then the linear's two GEMMs. The cpu
// runs GELU's backward kernel and the linear's (the same values).
template <class Half>
Tensor linear_gelu_mixed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         Precision rounded_copy) {
    MixedLinear<Half> linear = mixed_linear_forward<Half>(x, weight, bias);
    if (linear.backward.padded || linear.y.device() == Device::cpu) {  // the two ops
        Tensor y =
            autograd::record("linear", linear.y, {x, weight, bias}, std::move(linear.backward));
        return gelu(y, rounded_copy);
    }
    const Tensor h = gelu(linear.y, rounded_copy);  // y takes no gradient: no node of its own
    auto backward = [lin = std::move(linear.backward),
                     y = autograd::saved(linear.y)](const Tensor& dh) {
        lin.check_weight_unchanged();
        const auto [dy_rounded, db] = round_and_sum_columns<Half>(
            rows_of(dh), lin.need_b, y.reshape({lin.R, lin.N}));  // dỸ, db from dH and Y
        return lin.gradients(dy_rounded, db);
    };
    return autograd::record("linear_gelu", h, {x, weight, bias}, std::move(backward));
}

// linear_gelu_linear on cuda (c_fc not padded): c_proj(gelu(c_fc(x))) as one node. The forward
// writes gelu's output only rounded, h̃ (the one operand c_proj's GEMM reads), where linear_gelu
// then linear write h in float32 too and read it never; it saves y for GELU's derivative, as
// linear_gelu does. The backward is the two nodes' in order: c_proj's (dH = dỸ · W̃_proj, dW_proj =
// dỸᵀ · h̃, db_proj), then dY = dH ⊙ gelu'(Y) rounded and summed for db_fc in one pass, then c_fc's
// GEMMs. The same kernels on the same values: the two ops' results and gradients, bit for bit.
template <class Half>
Tensor linear_gelu_linear_mixed(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                                const Tensor& w_proj, const Tensor& b_proj) {
    constexpr DType kHalf = dtype_of<Half>();
    MixedLinear<Half> fc = mixed_linear_forward<Half>(x, w_fc, b_fc);
    const int64_t R = fc.backward.R, N = fc.backward.N;
    const Tensor h_rounded = Tensor::empty({R, N}, kHalf, Device::cuda);  // h̃
#ifdef QK_WITH_CUDA
    cuda::unary_forward<float, math::Gelu>(nullptr, fc.y.template data<float>(), R * N, 0.0f,
                                           half_bits(h_rounded), kHalf == kBF16);
#endif
    Shape h_shape = x.shape();
    h_shape.back() = N;
    const bool need_h = fc.backward.need_x || fc.backward.need_w || fc.backward.need_b;
    MixedLinear<Half> proj =
        mixed_linear_forward<Half>(HalfInput{h_rounded, h_shape, need_h}, w_proj, b_proj);
    auto backward = [fc = std::move(fc.backward), proj = std::move(proj.backward),
                     y = autograd::saved(fc.y)](const Tensor& dout) {
        const std::vector<Tensor> g_proj = proj(dout);  // dH, dW_proj, db_proj
        std::vector<Tensor> g_fc(3);
        if (g_proj[0].defined()) {
            fc.check_weight_unchanged();
            const auto [dy_rounded, db] = round_and_sum_columns<Half>(
                rows_of(g_proj[0]), fc.need_b, y.reshape({fc.R, fc.N}));  // dỸ, db from dH and Y
            g_fc = fc.gradients(dy_rounded, db);
        }
        return std::vector<Tensor>{g_fc[0], g_fc[1], g_fc[2], g_proj[1], g_proj[2]};
    };
    return autograd::record("linear_gelu_linear", proj.y, {x, w_fc, b_fc, w_proj, b_proj},
                            std::move(backward));
}

// glu_linear on cuda (gate and up not padded): c_proj(act(gate(x)) ⊙ up(x)) as one node, for
// gate and up without biases.
// Forward: x rounded once for both GEMMs; the product written only rounded (h̃, what c_proj's
// GEMMs read); the gate's and up's outputs saved for the product's derivative, as glu saves them.
// Backward, the nodes' in order: c_proj's (dH), then glu's kernel writing dG̃ and dŨ only rounded
// (with no bias nothing sums their float32 values, and their GEMMs read the roundings), then the
// gate's and up's GEMMs, and dx = dx_gate + dx_up, the float32 addition the engine makes.
template <class Half>
Tensor glu_linear_mixed(const Tensor& x_in, const Tensor& w_gate, const Tensor& w_up,
                        const Tensor& w_proj, const Tensor& b_proj, GluActivation activation) {
    constexpr DType kHalf = dtype_of<Half>();
    constexpr bool kBf16 = kHalf == kBF16;
    const Tensor x = autograd::saved(x_in);
    const HalfInput x_half{cast_once(rows_of(x), kHalf), x.shape(), x_in.requires_grad()};
    MixedLinear<Half> gate = mixed_linear_forward<Half>(x_half, w_gate, {});
    MixedLinear<Half> up = mixed_linear_forward<Half>(x_half, w_up, {});
    const int64_t R = gate.backward.R, N = gate.backward.N;
    const Tensor h_rounded = Tensor::empty({R, N}, kHalf, x.device());  // h̃
#ifdef QK_WITH_CUDA
    cuda::glu_forward<float>(nullptr, gate.y.template data<float>(), up.y.template data<float>(),
                             R * N, activation, half_bits(h_rounded), kBf16);
#endif
    Shape h_shape = x.shape();
    h_shape.back() = N;
    const bool need_h = x_in.requires_grad() || w_gate.requires_grad() || w_up.requires_grad();
    MixedLinear<Half> proj =
        mixed_linear_forward<Half>(HalfInput{h_rounded, h_shape, need_h}, w_proj, b_proj);
    auto backward = [gate_back = std::move(gate.backward), up_back = std::move(up.backward),
                     proj_back = std::move(proj.backward), g = autograd::saved(gate.y),
                     u = autograd::saved(up.y), activation, R, N](const Tensor& dout) {
        const std::vector<Tensor> g_proj = proj_back(dout);  // dH, dW_proj, db_proj
        std::vector<Tensor> g_gate(3), g_up(3);
        if (g_proj[0].defined()) {
            gate_back.check_weight_unchanged();
            up_back.check_weight_unchanged();
            const Tensor dh = g_proj[0].contiguous();
            const Tensor dg = Tensor::empty({R, N}, kHalf, dh.device());  // dG̃
            const Tensor du = Tensor::empty({R, N}, kHalf, dh.device());  // dŨ
#ifdef QK_WITH_CUDA
            cuda::glu_backward<float>(nullptr, nullptr, dh.template data<float>(),
                                      g.template data<float>(), u.template data<float>(), R * N,
                                      activation, half_bits(dg), half_bits(du), kBf16);
#endif
            g_gate = gate_back.gradients(dg, {});
            g_up = up_back.gradients(du, {});
        }
        Tensor dx = g_gate[0];
        if (dx.defined() && g_up[0].defined()) dx = dx + g_up[0];
        return std::vector<Tensor>{dx, g_gate[1], g_up[1], g_proj[1], g_proj[2]};
    };
    return autograd::record("glu_linear", proj.y, {x_in, w_gate, w_up, w_proj, b_proj},
                            std::move(backward));
}

// The head and its loss as one node (ops/loss.h). Forward: the linear (N′ wide when padded),
// then one kernel per row of logits writes lse, the row's loss and G = dL/dlogits for the upstream
// gradient the caller announced, rounded to Half and N′ wide (zero columns past V): dỸ as
// gradients() reads it. Backward: the fixup (nothing, unless the upstream gradient differs from
// the announced one), then the two GEMMs. It saves G, and the logits and lse for the fixup. A
// z-loss adds its term to the loss and to G in the same kernel.
template <class Half>
LinearCrossEntropy linear_cross_entropy_mixed(const Tensor& x, const Tensor& weight,
                                              const Tensor& t, int32_t ignore_index,
                                              int64_t n_valid, double loss_gradient,
                                              double z_loss) {
#ifdef QK_WITH_CUDA
    MixedLinear<Half> linear = mixed_linear_forward<Half>(x, weight, {});
    const Tensor& logits = linear.y;  // (N, V), rows x_ld apart
    const int64_t N = logits.size(0), V = logits.size(1);
    const int64_t x_ld = N > 0 ? logits.strides()[0] : V, g_ld = linear.backward.padded ? x_ld : V;
    constexpr bool kBF16Bits = dtype_of<Half>() == kBF16;
    const Tensor g = Tensor::empty({N, g_ld}, dtype_of<Half>(), Device::cuda);  // G̃
    const Tensor lse = Tensor::empty({N}, kF32, Device::cuda);
    const Tensor loss = Tensor::empty({}, kF32, Device::cuda);
    const Tensor g_upstream = Tensor::empty({}, kF32, Device::cuda);  // what g is the gradient for
    const Tensor ce = z_loss != 0 ? Tensor::empty({}, kF32, Device::cuda) : loss;
    cuda::cross_entropy_forward_gradient(loss.data<float>(), lse.data<float>(), half_bits(g),
                                         g_upstream.data<float>(), logits.data<float>(),
                                         t.data<int32_t>(), N, V, ignore_index, n_valid, x_ld, g_ld,
                                         loss_gradient, kBF16Bits, z_loss, ce.data<float>());
    auto backward = [lin = std::move(linear.backward), g, g_upstream,
                     logits = autograd::saved(logits), t = autograd::saved(t), lse, N, V, x_ld,
                     g_ld, ignore_index, n_valid, z_loss](const Tensor& dloss) {
        lin.check_weight_unchanged();
        QK_CHECK(dloss.device() == Device::cuda && dloss.numel() == 1 && dloss.dtype() == kF32,
                 "linear_cross_entropy backward: the upstream gradient must be one float32 "
                 "element on cuda, got {} of shape {} on {}",
                 dloss.dtype(), dloss.shape(), dloss.device());
        const Tensor dl = dloss.contiguous();
        cuda::cross_entropy_gradient_fixup(half_bits(g), g_upstream.data<float>(),
                                           logits.data<float>(), t.data<int32_t>(),
                                           lse.data<float>(), dl.data<float>(), N, V, ignore_index,
                                           n_valid, x_ld, g_ld, kBF16Bits, z_loss);
        return lin.gradients(g, {});
    };
    Tensor recorded =
        autograd::record("linear_cross_entropy", loss, {x, weight, Tensor()}, std::move(backward));
    return {recorded, logits.detach(), z_loss != 0 ? ce : recorded.detach()};
#else
    (void)x, (void)weight, (void)t, (void)ignore_index, (void)n_valid, (void)loss_gradient,
        (void)z_loss;
    throw_built_without_cuda("linear_cross_entropy");
#endif
}

}  // namespace

bool linear_pads_width(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    const int64_t rows = x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
    return pads_width(x.device(), rows, weight.size(0)) && weight.size(1) > 0 && !bias.defined();
}

Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    return linear_mixed<bf16>(x, weight, bias);
}
Tensor linear_fp16(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    return linear_mixed<f16>(x, weight, bias);
}

Tensor linear_gelu_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        Precision rounded_copy) {
    return linear_gelu_mixed<bf16>(x, weight, bias, rounded_copy);
}
Tensor linear_gelu_fp16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        Precision rounded_copy) {
    return linear_gelu_mixed<f16>(x, weight, bias, rounded_copy);
}

Tensor linear_gelu_linear_bf16(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                               const Tensor& w_proj, const Tensor& b_proj) {
    return linear_gelu_linear_mixed<bf16>(x, w_fc, b_fc, w_proj, b_proj);
}
Tensor linear_gelu_linear_fp16(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                               const Tensor& w_proj, const Tensor& b_proj) {
    return linear_gelu_linear_mixed<f16>(x, w_fc, b_fc, w_proj, b_proj);
}

Tensor glu_linear_bf16(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                       const Tensor& w_proj, const Tensor& b_proj, GluActivation activation) {
    return glu_linear_mixed<bf16>(x, w_gate, w_up, w_proj, b_proj, activation);
}
Tensor glu_linear_fp16(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                       const Tensor& w_proj, const Tensor& b_proj, GluActivation activation) {
    return glu_linear_mixed<f16>(x, w_gate, w_up, w_proj, b_proj, activation);
}

LinearCrossEntropy linear_cross_entropy_bf16(const Tensor& x, const Tensor& weight, const Tensor& t,
                                             int32_t ignore_index, int64_t n_valid,
                                             double loss_gradient, double z_loss) {
    return linear_cross_entropy_mixed<bf16>(x, weight, t, ignore_index, n_valid, loss_gradient,
                                            z_loss);
}
LinearCrossEntropy linear_cross_entropy_fp16(const Tensor& x, const Tensor& weight, const Tensor& t,
                                             int32_t ignore_index, int64_t n_valid,
                                             double loss_gradient, double z_loss) {
    return linear_cross_entropy_mixed<f16>(x, weight, t, ignore_index, n_valid, loss_gradient,
                                           z_loss);
}

}  // namespace qk::matmul_impl
