// AdamW, SGD, the cosine schedule and global-norm clipping.
//
// AdamW, per element, at step t with gradient g (Loshchilov & Hutter 2019):
//   m = β1 m + (1 − β1) g              first moment
//   v = β2 v + (1 − β2) g²             second moment
//   m̂ = m / (1 − β1^t),  v̂ = v / (1 − β2^t)   bias corrections
//   p = p − lr · (m̂ / (sqrt(v̂) + ε) + λ p)    decoupled decay (λ = wd, or wd / lr_max for the
//                                               independent variant, so lr · λ = (lr/lr_max)·wd)
// One fused pass per parameter: read p, g, m, v; write p, m, v. A parameter on cuda takes the
// same pass on the device (cuda/adamw.cu); the moments live on the parameter's device.
// SGD is written with tensor ops, so it runs on whichever device the parameters live on.
#include "nn/optim.h"

#include <cmath>
#include <numbers>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace qk::nn {

namespace cpu {

// p, g, m, v: (n) contiguous.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps, T decay,
                  T bias1, T bias2) {
#pragma omp parallel for simd if (parallel : n >= (1 << 16))  // small tensors stay SIMD
    for (int64_t i = 0; i < n; ++i) {
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        const T m_hat = m[i] / bias1, v_hat = v[i] / bias2;
        p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + decay * p[i]);
    }
}

}  // namespace cpu

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {
    for (const Tensor& p : params_) {
        QK_CHECK(p.is_contiguous() && p.requires_grad(),
                 "AdamW: parameters must be contiguous and require grad, got shape {}", p.shape());
        m_.push_back(zeros_like(p));
        v_.push_back(zeros_like(p));
    }
}

void AdamW::step(double lr) {
    ++step_;
    const double bias1 = 1 - std::pow(options_.beta1, step_);
    const double bias2 = 1 - std::pow(options_.beta2, step_);
    for (size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = params_[i];
        Tensor g = p.grad();
        if (!g.defined()) continue;
        g = g.contiguous();
        double decay = p.dim() >= 2 ? options_.weight_decay : 0.0;
        if (options_.independent_weight_decay) decay /= options_.lr_max;
        switch (p.device()) {
            case Device::cpu:
                dispatch_float(p.dtype(), [&](auto tag) {
                    using T = decltype(tag);
                    cpu::adamw_update<T>(p.data<T>(), g.data<T>(), m_[i].data<T>(), v_[i].data<T>(),
                                         p.numel(), T(lr), T(options_.beta1), T(options_.beta2),
                                         T(options_.eps), T(decay), T(bias1), T(bias2));
                });
                break;
            case Device::cuda:
#ifdef QK_WITH_CUDA
                QK_CHECK(g.device() == Device::cuda && m_[i].device() == Device::cuda,
                         "AdamW: parameter {} of shape {} is on cuda but its gradient is on {} and "
                         "its moments on {}",
                         i, p.shape(), g.device(), m_[i].device());
                dispatch_float(p.dtype(), [&](auto tag) {
                    using T = decltype(tag);
                    qk::cuda::adamw_update<T>(p.data<T>(), g.data<T>(), m_[i].data<T>(),
                                              v_[i].data<T>(), p.numel(), T(lr), T(options_.beta1),
                                              T(options_.beta2), T(options_.eps), T(decay),
                                              T(bias1), T(bias2));
                });
#else
                throw_built_without_cuda("AdamW");
#endif
                break;
        }
    }
}

void AdamW::zero_grad() {
    for (Tensor& p : params_) p.zero_grad();
}

std::vector<Tensor> AdamW::state() const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params_.size(); ++i) {
        out.push_back(m_[i]);
        out.push_back(v_[i]);
    }
    return out;
}

void AdamW::load_state(const std::vector<Tensor>& state, int64_t steps) {
    QK_CHECK(state.size() == 2 * params_.size(),
             "AdamW: state has {} tensors, expected {} (m and v "
             "for {} parameters)",
             state.size(), 2 * params_.size(), params_.size());
    for (size_t i = 0; i < params_.size(); ++i)
        for (int k = 0; k < 2; ++k) {
            const Tensor& s = state[2 * i + k];
            QK_CHECK(s.shape() == params_[i].shape() && s.dtype() == params_[i].dtype(),
                     "AdamW: state tensor {} is {} {}, parameter {} is {} {}", 2 * i + k, s.dtype(),
                     s.shape(), i, params_[i].dtype(), params_[i].shape());
            copy_into(k == 0 ? m_[i] : v_[i], s);
        }
    step_ = steps;
}

SGD::SGD(std::vector<Tensor> params, double momentum, double weight_decay)
    : params_(std::move(params)), momentum_(momentum), weight_decay_(weight_decay) {
    for (const Tensor& p : params_) velocity_.push_back(zeros_like(p));
}

void SGD::step(double lr) {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = params_[i];
        if (!p.grad().defined()) continue;
        Tensor g = p.grad();
        if (weight_decay_ > 0 && p.dim() >= 2) g = g + p * weight_decay_;
        copy_into(velocity_[i], velocity_[i] * momentum_ + g);
        copy_into(p, p - velocity_[i] * lr);
    }
}

void SGD::zero_grad() {
    for (Tensor& p : params_) p.zero_grad();
}

double cosine_lr(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
    if (warmup > 0 && step < warmup)
        return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (step >= total) return lr_min;
    const double progress = static_cast<double>(step - warmup) /
                            static_cast<double>(std::max<int64_t>(total - warmup, 1));
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + std::cos(std::numbers::pi * progress));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, bool throw_on_nonfinite) {
    NoGradGuard no_grad;
    double total = 0;
    for (const Tensor& p : params) {
        if (!p.grad().defined()) continue;
        if (p.grad().device() != Device::cpu) {  // summed on the device, one number comes back
            const Tensor g = p.grad().to(kF64);
            total += sum(g * g).item();
            continue;
        }
        Tensor g = p.grad().contiguous();
        dispatch_float(g.dtype(), [&](auto tag) {  // squares summed in double: millions of terms
            const auto* data = g.data<decltype(tag)>();
            double partial = 0;
#pragma omp simd reduction(+ : partial)
            for (int64_t i = 0; i < g.numel(); ++i) partial += double(data[i]) * double(data[i]);
            total += partial;
        });
    }
    const double norm = std::sqrt(total);
    if (!std::isfinite(norm)) {
        QK_CHECK(!throw_on_nonfinite,
                 "clip_grad_norm: the gradient norm is {} (a NaN or Inf gradient)", norm);
        return norm;
    }
    if (max_norm > 0 && norm > max_norm) {
        const double scale = max_norm / (norm + 1e-6);
        for (const Tensor& p : params)
            if (p.grad().defined()) copy_into(p.grad(), p.grad() * scale);
    }
    return norm;
}

}  // namespace qk::nn
