// Optimisers and gradient clipping (the learning-rate schedules are in lr_schedule.h).
#pragma once

#include <string>
#include <vector>

#include "core/storage.h"
#include "core/tensor.h"

namespace qk::nn {

struct AdamWOptions {
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;
    // Decoupled (AdamW, Loshchilov & Hutter): p -= lr * wd * p.
    // Independent (Wortsman et al. 2023): p -= (lr / lr_max) * wd * p, so the decay per step does
    // not scale with the peak learning rate; lr_max is the schedule's peak.
    bool independent_weight_decay = false;
    double lr_max = 1e-3;
};

// AdamW. Weight decay applies to parameters of rank >= 2 only (matrices and embeddings, not
// biases, norm gains or qk scales), as in nanoGPT.
class AdamW {
  public:
    // decayed[i]: whether weight decay applies to params[i]; empty: to those of rank >= 2.
    AdamW(std::vector<Tensor> params, AdamWOptions options, std::vector<bool> decayed = {});
    void step(double lr);  // one update with this step's learning rate; skips params without grad
    void zero_grad();

    int64_t steps() const { return step_; }
    const AdamWOptions& options() const { return options_; }
    // The moments, for checkpoints: m then v per parameter, in parameter order.
    std::vector<Tensor> state() const;
    void load_state(const std::vector<Tensor>& state, int64_t steps);

  private:
    std::vector<Tensor> params_, m_, v_;
    std::vector<bool> decayed_;
    AdamWOptions options_;
    int64_t step_ = 0;
};

// SGD with heavy-ball momentum: v = μ v + g, then p -= lr v. weight_decay adds wd · p to g (L2,
// not decoupled), for parameters of rank >= 2 only, as AdamW's default.
class SGD {
  public:
    SGD(std::vector<Tensor> params, double momentum = 0.9, double weight_decay = 0.0);
    void step(double lr);
    void zero_grad();

  private:
    std::vector<Tensor> params_, velocity_;
    double momentum_, weight_decay_;
};

// Scales all gradients so that their global L2 norm is at most max_norm (if max_norm > 0).
// Returns the norm before clipping. A NaN or Inf norm throws, unless throw_on_nonfinite is false:
// then it is returned and nothing is scaled (the trainer reports the divergence itself, or skips
// the step under loss scaling). Gradients of loss_scale × the loss (fp16's dynamic loss scaling)
// are divided by it in the same pass: the norm returned is the unscaled one.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm,
                      bool throw_on_nonfinite = true, double loss_scale = 1.0);
// What clipping multiplies the gradients by, given their true (unscaled, finite) norm: the clip
// to max_norm (when max_norm > 0 and the norm exceeds it) and 1 / loss_scale. Shared by
// clip_grad_norm and ZeRO-1's sharded clip.
inline double clip_multiplier(double norm, double max_norm, double loss_scale) {
    const double clip = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
    return clip / loss_scale;
}

}  // namespace qk::nn

namespace qk::nn {
// One parameter's AdamW update as the kernels see it: p, m, v (n) updated in place, g (n), all
// contiguous on one device; decay is this parameter's λ (0 where weight decay does not apply).
// half (n), when not null, receives the new p rounded to half_dtype (bf16 or f16): the weight's
// cast copy (Storage::cast_copy) written in the same pass, as llm.c's AdamW writes its bf16
// weights, so no GEMM rounds the weight again.
template <class T>
struct AdamWSlot {
    T* p;
    const T* g;
    T *m, *v;
    int64_t n;
    T decay;
    void* half = nullptr;
    DType half_dtype = DType::f32;
};
// For the optimizers that write weights (AdamW, Muon): the bf16 or f16 copy a GEMM made of p's
// values (Storage::cast_copy, made only for a tensor that is its whole buffer), for the update to
// rewrite in its own pass, or null; and after such an update, the mark that the copy holds p's new
// version (anything else that writes p makes it stale again).
const Storage::CastCopy* half_copy_of(const Tensor& p);
void written_with_half_copy(const Tensor& p);

// half[lo, hi) = p[lo, hi) rounded to bf16 or f16 (dtype), as Tensor::to rounds them: the cpu
// updates' rewrite of a weight's cast copy.
void round_into_half(void* half, DType dtype, const float* p, int64_t lo, int64_t hi);

}  // namespace qk::nn

// The CUDA twins of the optimizer's passes (the cpu loops are in nn/optim/optim.cpp): device
// pointers, contiguous, instantiated for float and double. bias1 and bias2 are 1 − β1^t and
// 1 − β2^t.
namespace qk::cuda {
// One tensor's AdamW update (cuda/adamw.cu): the first rung of the ladder, one launch per tensor.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps, T decay,
                  T bias1, T bias2);
// Every slot's update in one launch (cuda/multi_tensor.cu), element by element the same result.
template <class T>
void adamw_update_all(const std::vector<nn::AdamWSlot<T>>& slots, T lr, T beta1, T beta2, T eps,
                      T bias1, T bias2);
// Σ x² over every tensor (sizes[k] elements at tensors[k]) in one pass of as many blocks as
// 32k-element chunks, combined in double by a second one-block pass; one double comes back.
template <class T>
double sum_of_squares(const std::vector<const T*>& tensors, const std::vector<int64_t>& sizes);
// x *= scale for every tensor, in one launch.
template <class T>
void scale_all(const std::vector<T*>& tensors, const std::vector<int64_t>& sizes, T scale);
}  // namespace qk::cuda
