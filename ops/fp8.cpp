// Simulated FP8: delayed per-tensor scaling, the cast, the straight-through rounding and linear on
// FP8 operands (the recipe and its formulas are in ops/fp8.h).
//
// linear_fp8, forward and backward. With q_a = round(a · s_a) and ã = q_a / s_a the value a
// stands for, the three GEMMs of linear (ops/matmul.cpp) read the rounded operands:
//     y  = b + x̃ · W̃ᵀ  = b + (q_x · q_wᵀ) / (s_x s_w)
//     dx = dỸ · W̃      = (q_dy · q_w) / (s_dy s_w)
//     dW = dỸᵀ · x̃     = (q_dyᵀ · q_x) / (s_dy s_x)
//     db = Σ_r dY                                    (float32, not rounded)
// The GEMMs run on the q's (products of two FP8 values are exact in float32) and the result is
// divided by the scales once, as an FP8 tensor core's epilogue does. Saved for the backward: q_x,
// q_w and their scales (the FP8 copies, a quarter of float32's bytes on real hardware).
#include "ops/fp8.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/threading.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"
#include "ops/reduce.h"

namespace qk {

// ---- delayed scaling -------------------------------------------------------------------------

namespace {

const char* format_name(MiniFormat f) {
    return f == MiniFormat::e4m3 ? "e4m3" : f == MiniFormat::e5m2 ? "e5m2" : "float16";
}

}  // namespace

DelayedScaling::DelayedScaling(MiniFormat format, int64_t history_len, Overflow overflow)
    : format_(format),
      history_len_(history_len),
      overflow_(format == MiniFormat::e4m3 ? Overflow::saturate : overflow) {
    QK_CHECK(format == MiniFormat::e4m3 || format == MiniFormat::e5m2,
             "DelayedScaling: FP8 scaling takes e4m3 or e5m2, got {}", format_name(format));
    QK_CHECK(history_len >= 1, "DelayedScaling: history_len must be >= 1, got {}", history_len);
}

void DelayedScaling::record(double amax) {
    if (!std::isfinite(amax)) return;
    if (static_cast<int64_t>(history_.size()) == history_len_) history_.erase(history_.begin());
    history_.push_back(static_cast<float>(amax));
    ++recent_;
    const float window_max = *std::max_element(history_.begin(), history_.end());
    // s = max_finite / amax, computed in double and rounded once; an all-zero history keeps s.
    if (window_max > 0)
        scale_ = static_cast<float>(max_finite(format_) / static_cast<double>(window_max));
}

std::vector<float> DelayedScaling::take_recent() {
    const auto n = static_cast<std::ptrdiff_t>(
        std::min<int64_t>(recent_, static_cast<int64_t>(history_.size())));
    std::vector<float> recent(history_.end() - n, history_.end());
    history_.erase(history_.end() - n, history_.end());
    recent_ = 0;
    return recent;
}

int64_t DelayedScaling::take_saturated() {
    const int64_t n = saturated_;
    saturated_ = 0;
    return n;
}

std::string DelayedScaling::state_json() const {
    return nlohmann::json{{"format", format_name(format_)},
                          {"history_len", history_len_},
                          {"scale", scale_},
                          {"amax_history", history_}}
        .dump();
}

void DelayedScaling::load_state_json(const std::string& text, const std::string& origin) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    const auto bad = [&](const std::string& why) {
        return Error(fmt::format("{}: FP8 scaling state {}: {}", origin, why, text.substr(0, 200)));
    };
    if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
        !j.contains("scale") || !j["scale"].is_number() || !j.contains("amax_history") ||
        !j["amax_history"].is_array())
        throw bad("is not an object with format, scale and amax_history");
    if (j["format"].get<std::string>() != format_name(format_))
        throw bad(fmt::format("is for {}, this tensor is scaled in {}",
                              j["format"].get<std::string>(), format_name(format_)));
    const double scale = j["scale"].get<double>();
    if (!(std::isfinite(scale) && scale > 0)) throw bad("has a scale that is not finite and > 0");
    std::vector<float> history;
    for (const auto& v : j["amax_history"]) {
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
            throw bad("has an amax that is not a finite number >= 0");
        history.push_back(v.get<float>());
    }
    // A shorter history length now keeps the newest entries.
    if (static_cast<int64_t>(history.size()) > history_len_)
        history.erase(history.begin(), history.end() - history_len_);
    history_ = std::move(history);
    scale_ = static_cast<float>(scale);
}

// ---- the cast --------------------------------------------------------------------------------

namespace cpu {

void fp8_quantize(float* q, const float* x, int64_t n, float scale, MiniFormat format,
                  Overflow overflow, float* amax, int64_t* saturated) {
    // Fixed split into tasks, partials combined in task order: the same result on any thread count.
    constexpr int kTasks = 16;
    float task_amax[kTasks] = {};
    int64_t task_saturated[kTasks] = {};
    const float limit = static_cast<float>(max_finite(format));
    const FastRounder round(format, overflow);
    auto task = [&](int t) {
        const int64_t begin = n * t / kTasks, end = n * (t + 1) / kTasks;
        float m = 0;
        int64_t nans = 0, count = 0;  // a max skips a NaN: count them instead
#pragma omp simd reduction(max : m) reduction(+ : nans, count)
        for (int64_t i = begin; i < end; ++i) {
            const float a = std::abs(x[i]), r = round(x[i] * scale);
            nans += a != a;
            m = a > m ? a : m;
            q[i] = r;
            count += std::abs(r) >= limit;  // the largest finite value, or Inf
        }
        task_amax[t] = nans > 0 ? NAN : m;
        task_saturated[t] = count;
    };
    if (n >= (1 << 16))
        parallel_run(kTasks, task);
    else
        for (int t = 0; t < kTasks; ++t) task(t);
    float m = 0;
    int64_t count = 0;
    for (int t = 0; t < kTasks; ++t) {
        m = std::isnan(m) || std::isnan(task_amax[t]) ? NAN : std::max(m, task_amax[t]);
        count += task_saturated[t];
    }
    *amax = m;
    *saturated = count;
}

}  // namespace cpu

Fp8Cast fp8_cast(const Tensor& x_in, DelayedScaling& scaling, bool record) {
    QK_CHECK(x_in.defined() && x_in.dtype() == kF32, "fp8_cast: needs a float32 tensor, got {} {}",
             x_in.defined() ? x_in.dtype() : kF32, x_in.defined() ? x_in.shape() : Shape{});
    const Tensor x = x_in.detach().contiguous();
    Tensor q = Tensor::empty(x.shape(), kF32, x.device());
    const float scale = scaling.scale();
    float amax = 0;
    int64_t saturated = 0;
    auto args = std::tuple(q.data<float>(), x.data<float>(), x.numel(), scale, scaling.format(),
                           scaling.overflow(), &amax, &saturated);
    switch (x.device()) {
        case Device::cpu:
            std::apply(cpu::fp8_quantize, args);
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            std::apply(cuda::fp8_quantize, args);
#else
            throw_built_without_cuda("fp8_cast");
#endif
            break;
    }
    if (record) {  // a training cast: evaluation neither moves the scale nor adds to the counts
        scaling.add_saturated(saturated);
        scaling.record(amax);
    }
    return {q, scale};
}

Tensor fp8_round(const Tensor& x, DelayedScaling& scaling) {
    const Fp8Cast cast = fp8_cast(x, scaling, autograd::grad_enabled());
    Tensor rounded;
    {
        NoGradGuard no_grad;
        rounded = cast.q * (1.0 / static_cast<double>(cast.scale));
    }
    return autograd::record("fp8_round", rounded, {x},
                            [](const Tensor& dy) { return std::vector<Tensor>{dy}; });
}

// ---- linear on FP8 operands ------------------------------------------------------------------

namespace {

// (q_a · q_bᵀ or q_a · q_b) / (s_a s_b): a float32 GEMM of FP8 values, divided by the scales once.
Tensor scaled_product(const Tensor& a, const Tensor& b, float s_a, float s_b) {
    return matmul(a, b) * (1.0 / (static_cast<double>(s_a) * static_cast<double>(s_b)));
}

}  // namespace

Tensor linear_fp8(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                  const std::shared_ptr<Fp8LinearScaling>& scaling) {
    QK_CHECK(scaling != nullptr, "linear_fp8: needs its layer's scaling state, got none");
    QK_CHECK(x_in.defined() && weight_in.defined() && x_in.dtype() == kF32 &&
                 weight_in.dtype() == kF32 && weight_in.dim() == 2 && x_in.dim() >= 1 &&
                 x_in.size(-1) == weight_in.size(1),
             "linear_fp8: needs float32 x (..., K) and weight (N, K), got x {} {} and weight {} {}",
             x_in.defined() ? x_in.dtype() : kF32, x_in.defined() ? x_in.shape() : Shape{},
             weight_in.defined() ? weight_in.dtype() : kF32,
             weight_in.defined() ? weight_in.shape() : Shape{});
    QK_CHECK(!bias_in.defined() || (bias_in.dtype() == kF32 && bias_in.dim() == 1 &&
                                    bias_in.size(0) == weight_in.size(0)),
             "linear_fp8: bias is {} {}, expected float32 [{}]", bias_in.dtype(), bias_in.shape(),
             weight_in.size(0));
    const bool training = autograd::grad_enabled();
    const int64_t N = weight_in.size(0);
    Shape out_shape = x_in.shape();
    out_shape.back() = N;
    Tensor y;
    Fp8Cast qx, qw;
    {
        NoGradGuard no_grad;
        qx = fp8_cast(matmul_impl::rows_of(x_in.detach()), scaling->x, training);  // (R, K)
        qw = fp8_cast(weight_in.detach(), scaling->weight, training);              // (N, K)
        y = scaled_product(qx.q, qw.q.t(), qx.scale, qw.scale);                    // (R, N)
        if (bias_in.defined()) y = y + bias_in.detach();
        y = y.reshape(out_shape);
    }
    const bool need_x = x_in.requires_grad(), need_w = weight_in.requires_grad();
    const bool need_b = bias_in.defined() && bias_in.requires_grad();
    auto backward = [qx, qw, scaling, need_x, need_w, need_b, N,
                     x_shape = x_in.shape()](const Tensor& dy) {
        const Tensor dy_rows = matmul_impl::rows_of(dy);             // (R, N)
        const Fp8Cast qdy = fp8_cast(dy_rows, scaling->grad, true);  // E5M2
        Tensor dx, dw, db;
        if (need_x) dx = scaled_product(qdy.q, qw.q, qdy.scale, qw.scale).reshape(x_shape);
        if (need_w) dw = scaled_product(qdy.q.t(), qx.q, qdy.scale, qx.scale);  // (N, K)
        if (need_b) db = sum_to(dy_rows, {N});                                  // Σ_r dY
        return std::vector<Tensor>{dx, dw, db};
    };
    return autograd::record("linear_fp8", y, {x_in, weight_in, bias_in}, std::move(backward));
}

}  // namespace qk
