// AdamW, SGD and global-norm clipping.
//
// AdamW, per element, at step t with gradient g (Loshchilov & Hutter 2019):
//   m = β1 m + (1 − β1) g              first moment
//   v = β2 v + (1 − β2) g²             second moment
//   m̂ = m / (1 − β1^t),  v̂ = v / (1 − β2^t)   bias corrections
//   p = p − lr · (m̂ / (sqrt(v̂) + ε) + λ p)    decoupled decay (λ = wd, or wd / lr_max for the
//                                               independent variant, so lr · λ = (lr/lr_max)·wd)
// One fused pass over every parameter (one parallel region for all of them): read p, g, m, v;
// write p, m, v. Parameters on cuda take the same pass on the device, all of them in one launch
// (cuda/multi_tensor.cu); the moments live on the parameter's device.
// SGD is written with tensor ops, so it runs on whichever device the parameters live on.
#include "nn/optim/optim.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "core/half_convert.h"
#include "core/threading.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace qk::nn {

namespace cpu {

// p, g, m, v: (n) contiguous.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps, T decay,
                  T bias1, T bias2) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        const T m_hat = m[i] / bias1, v_hat = v[i] / bias2;
        p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + decay * p[i]);
    }
}

// Tensors laid end to end, as one index space for the threads to share: element i of tensor k is
// element start[k] + i overall. One parallel region then serves a whole list of parameters, each
// thread cutting through tensors where its share ends. (A region per parameter was ~2 x 8 pool
// hand-offs per step at config A, most for tensors too small to split.)
class EndToEnd {
  public:
    explicit EndToEnd(const std::vector<int64_t>& sizes) : start_(sizes.size() + 1, 0) {
        for (size_t k = 0; k < sizes.size(); ++k) start_[k + 1] = start_[k] + sizes[k];
    }
    int64_t total() const { return start_.back(); }
    // piece(k, lo, hi) for the part [lo, hi) of tensor k that falls in [begin, end) overall.
    template <class Piece>
    void for_each_piece(int64_t begin, int64_t end, Piece piece) const {
        for (size_t k = 0; k + 1 < start_.size(); ++k) {
            const int64_t lo = std::max(begin, start_[k]), hi = std::min(end, start_[k + 1]);
            if (lo < hi) piece(k, lo - start_[k], hi - start_[k]);
        }
    }

  private:
    std::vector<int64_t> start_;
};

// Below this many elements in all, the update stays on one thread.
constexpr int64_t kParallelUpdate = 1 << 16;

// Every parameter's update in one parallel region; the same result, element by element.
template <class T>
void adamw_update_all(const std::vector<AdamWSlot<T>>& slots, T lr, T beta1, T beta2, T eps,
                      T bias1, T bias2) {
    std::vector<int64_t> sizes;
    for (const AdamWSlot<T>& s : slots) sizes.push_back(s.n);
    const EndToEnd all(sizes);
    auto range = [&](int64_t begin, int64_t end) {
        all.for_each_piece(begin, end, [&](size_t k, int64_t lo, int64_t hi) {
            const AdamWSlot<T>& s = slots[k];
            adamw_update(s.p + lo, s.g + lo, s.m + lo, s.v + lo, hi - lo, lr, beta1, beta2, eps,
                         s.decay, bias1, bias2);
            if constexpr (std::is_same_v<T, float>)
                if (s.half) round_into_half(s.half, s.half_dtype, s.p, lo, hi);
        });
    };
    parallel_for(all.total(), range, all.total() >= kParallelUpdate);
}

// Σ g² over the float tensors `grads` (contiguous, cpu), in double: millions of terms. Each thread
// sums its share, and the shares are added in thread order, so a run replays exactly.
template <class T>
double sum_of_squares(const std::vector<T*>& grads, const std::vector<int64_t>& sizes) {
    const EndToEnd all(sizes);
    const int threads = all.total() >= kParallelUpdate ? num_threads() : 1;
    std::vector<double> partial(threads, 0.0);
    auto share = [&](int t) {
        const int64_t begin = all.total() * t / threads, end = all.total() * (t + 1) / threads;
        all.for_each_piece(begin, end, [&](size_t k, int64_t lo, int64_t hi) {
            const T* g = grads[k];
            double sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = lo; i < hi; ++i) sum += double(g[i]) * double(g[i]);
            partial[t] += sum;
        });
    };
    parallel_run(threads, share);
    double total = 0;
    for (double p : partial) total += p;
    return total;
}

// g *= scale over the tensors `grads` (contiguous, cpu), in one parallel region.
template <class T>
void scale_all(const std::vector<T*>& grads, const std::vector<int64_t>& sizes, T scale) {
    const EndToEnd all(sizes);
    auto range = [&](int64_t begin, int64_t end) {
        all.for_each_piece(begin, end, [&](size_t k, int64_t lo, int64_t hi) {
            T* g = grads[k];
#pragma omp simd
            for (int64_t i = lo; i < hi; ++i) g[i] *= scale;
        });
    };
    parallel_for(all.total(), range, all.total() >= kParallelUpdate);
}

}  // namespace cpu

void round_into_half(void* half, DType dtype, const float* p, int64_t lo, int64_t hi) {
    if (dtype == DType::f16)
        return qk::cpu::floats_to_f16(static_cast<f16*>(half) + lo, p + lo, hi - lo);
    bf16* out = static_cast<bf16*>(half);
    for (int64_t i = lo; i < hi; ++i) out[i] = bf16(p[i]);
}

const Storage::CastCopy* half_copy_of(const Tensor& p) {
    const Storage::CastCopy& copy = p.storage()->cast_copy();
    const bool half = copy.dtype == DType::bf16 || copy.dtype == DType::f16;
    return copy.storage && half && is_whole_buffer(p) && p.dtype() == DType::f32 ? &copy : nullptr;
}

void written_with_half_copy(const Tensor& p) {
    mark_written(p);
    if (!half_copy_of(p)) return;
    Storage::CastCopy& copy = p.storage()->cast_copy();
    copy.version = p.storage()->version();
    copy.recorded_only = !writes_take_effect(p);  // a dry run's update wrote nothing
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options, std::vector<bool> decayed)
    : params_(std::move(params)), decayed_(std::move(decayed)), options_(options) {
    if (decayed_.empty())
        for (const Tensor& p : params_) decayed_.push_back(p.dim() >= 2);
    QK_CHECK(decayed_.size() == params_.size(), "AdamW: {} decay flags for {} parameters",
             decayed_.size(), params_.size());
    for (const Tensor& p : params_) {
        QK_CHECK(p.is_contiguous() && p.requires_grad(),
                 "AdamW: parameters must be contiguous and require grad, got shape {}", p.shape());
        m_.push_back(zeros_like(p));
        v_.push_back(zeros_like(p));
    }
}

// The slots of one step, by device and float type: one pass (one launch on cuda) for each list.
struct AdamWSlots {
    std::vector<AdamWSlot<float>> cpu_f32, cuda_f32;
    std::vector<AdamWSlot<double>> cpu_f64, cuda_f64;
    template <class T>
    void add(Device device, const AdamWSlot<T>& slot) {
        if constexpr (std::is_same_v<T, float>)
            (device == Device::cpu ? cpu_f32 : cuda_f32).push_back(slot);
        else
            (device == Device::cpu ? cpu_f64 : cuda_f64).push_back(slot);
    }
};

void AdamW::step(double lr) {
    ++step_;
    const double bias1 = 1 - std::pow(options_.beta1, step_);
    const double bias2 = 1 - std::pow(options_.beta2, step_);
    AdamWSlots slots;
    std::vector<Tensor> keep_alive;  // contiguous copies of strided gradients, until the update
    std::vector<Tensor> updated;
    for (size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = params_[i];
        Tensor g = p.grad();
        if (!g.defined()) continue;
        g = g.contiguous();
        keep_alive.push_back(g);
        QK_CHECK(g.device() == p.device() && m_[i].device() == p.device(),
                 "AdamW: parameter {} of shape {} is on {} but its gradient is on {} and its "
                 "moments on {}",
                 i, p.shape(), p.device(), g.device(), m_[i].device());
        double decay = decayed_[i] ? options_.weight_decay : 0.0;
        if (options_.independent_weight_decay) decay /= options_.lr_max;
        dispatch_float(p.dtype(), [&](auto tag) {
            using T = decltype(tag);
            AdamWSlot<T> slot{p.data<T>(),     g.data<T>(), m_[i].data<T>(),
                              v_[i].data<T>(), p.numel(),   T(decay)};
            if (const Storage::CastCopy* copy = half_copy_of(p)) {
                slot.half = copy->storage->data();
                slot.half_dtype = copy->dtype;
            }
            slots.add(p.device(), slot);
        });
        updated.push_back(p);
    }
    const auto& o = options_;
    cpu::adamw_update_all<float>(slots.cpu_f32, lr, o.beta1, o.beta2, o.eps, bias1, bias2);
    cpu::adamw_update_all<double>(slots.cpu_f64, lr, o.beta1, o.beta2, o.eps, bias1, bias2);
    if (!slots.cuda_f32.empty() || !slots.cuda_f64.empty()) {
#ifdef QK_WITH_CUDA
        qk::cuda::adamw_update_all<float>(slots.cuda_f32, lr, o.beta1, o.beta2, o.eps, bias1,
                                          bias2);
        qk::cuda::adamw_update_all<double>(slots.cuda_f64, lr, o.beta1, o.beta2, o.eps, bias1,
                                           bias2);
#else
        throw_built_without_cuda("AdamW");
#endif
    }
    for (const Tensor& p : updated) written_with_half_copy(p);
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

namespace {

// The contiguous gradients of one float type on one device, as raw pointers for the multi-tensor
// passes (cpu::sum_of_squares and cpu::scale_all, or their cuda twins: one launch each).
template <class T>
struct GradList {
    std::vector<T*> data;
    std::vector<int64_t> sizes;
    void add(const Tensor& g) {
        data.push_back(g.data<T>());
        sizes.push_back(g.numel());
    }
};

// Every gradient of a parameter list, sorted into the lists the passes take.
struct Grads {
    GradList<float> cpu_f32, cuda_f32;
    GradList<double> cpu_f64, cuda_f64;
    std::vector<Tensor> others;  // strided ones: the tensor-op path

    explicit Grads(const std::vector<Tensor>& params) {
        for (const Tensor& p : params) {
            const Tensor& g = p.grad();
            if (!g.defined()) continue;
            const bool cpu = g.device() == Device::cpu;
            if (!g.is_contiguous())
                others.push_back(g);
            else if (g.dtype() == kF32)
                (cpu ? cpu_f32 : cuda_f32).add(g);
            else
                (cpu ? cpu_f64 : cuda_f64).add(g);
        }
    }

    double sum_of_squares() const {
        double total = cpu::sum_of_squares<float>(cpu_f32.data, cpu_f32.sizes) +
                       cpu::sum_of_squares<double>(cpu_f64.data, cpu_f64.sizes);
        if (!cuda_f32.data.empty() || !cuda_f64.data.empty()) {
#ifdef QK_WITH_CUDA
            total += qk::cuda::sum_of_squares<float>(as_const(cuda_f32.data), cuda_f32.sizes) +
                     qk::cuda::sum_of_squares<double>(as_const(cuda_f64.data), cuda_f64.sizes);
#else
            throw_built_without_cuda("clip_grad_norm");
#endif
        }
        for (const Tensor& g : others) {  // summed where it lives, in double; one number comes back
            const Tensor g64 = g.to(kF64);
            total += sum(g64 * g64).item();
        }
        return total;
    }

    void scale(double by) const {
        cpu::scale_all<float>(cpu_f32.data, cpu_f32.sizes, float(by));
        cpu::scale_all<double>(cpu_f64.data, cpu_f64.sizes, by);
#ifdef QK_WITH_CUDA
        if (!cuda_f32.data.empty())
            qk::cuda::scale_all<float>(cuda_f32.data, cuda_f32.sizes, float(by));
        if (!cuda_f64.data.empty()) qk::cuda::scale_all<double>(cuda_f64.data, cuda_f64.sizes, by);
#endif
        for (const Tensor& g : others) copy_into(g, g * by);
    }

    template <class T>
    static std::vector<const T*> as_const(const std::vector<T*>& data) {
        return {data.begin(), data.end()};
    }
};

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, bool throw_on_nonfinite,
                      double loss_scale) {
    NoGradGuard no_grad;
    const Grads grads(params);
    const double norm = std::sqrt(grads.sum_of_squares()) / loss_scale;
    if (!std::isfinite(norm)) {
        QK_CHECK(!throw_on_nonfinite,
                 "clip_grad_norm: the gradient norm is {} (a NaN or Inf gradient)", norm);
        return norm;
    }
    if (const double scale = clip_multiplier(norm, max_norm, loss_scale); scale != 1.0)
        grads.scale(scale);
    return norm;
}

}  // namespace qk::nn
