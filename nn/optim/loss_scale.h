// Dynamic loss scaling, for float16 mixed precision (--precision fp16).
//
// float16's smallest subnormal is 2^-24 ≈ 6e-8: gradients of a training loss often sit below it,
// and rounding dY to float16 in the backward GEMMs (ops/matmul_bf16.cpp) would flush them to zero.
// So the loss is multiplied by a scale S before the backward (every gradient comes out S times
// larger, into float16's range) and the gradients are divided by S before clipping and the update
// (by a power of two: exact). Too large an S makes dY overflow to Inf instead, so S adapts:
//   - a step whose gradients hold an Inf or NaN is skipped (no update, the moments untouched) and
//     S is halved;
//   - after growth_interval clean steps in a row, S is doubled.
// The defaults are PyTorch's GradScaler's: S = 2^16, ×2 every 2000 clean steps, ×0.5 on overflow.
// The scale, the clean-step count and the skipped steps are saved in checkpoints, so that a resumed
// run takes the same decisions as an unbroken one.
#pragma once

#include <cstdint>
#include <string>

namespace qk::nn {

struct LossScaleOptions {
    double init = 65536.0;  // 2^16
    int64_t growth_interval = 2000;
    double growth_factor = 2.0, backoff_factor = 0.5;
    // false: the scale stays at init and only the skipping remains (FP8, where per-tensor scales
    // adapt instead and an E5M2 gradient that overflowed to Inf still must not reach the update).
    bool adjust = true;
};

class LossScaler {
  public:
    // Throws qk::Error naming the option unless init is finite and > 0, growth_interval >= 1,
    // growth_factor > 1 and backoff_factor in (0, 1).
    explicit LossScaler(const LossScaleOptions& options = {});

    double scale() const { return scale_; }
    // After a step's backward: `overflow` says its gradients held an Inf or NaN. Returns true
    // when the step is to be taken, false when it is skipped.
    bool update(bool overflow);
    int64_t skipped_steps() const { return skipped_; }
    int64_t clean_steps() const { return clean_; }  // since the last change of scale

    // The state as JSON (for a checkpoint's metadata) and back; a hostile value is a qk::Error
    // naming `origin`.
    std::string state_json() const;
    void load_state_json(const std::string& text, const std::string& origin);

  private:
    LossScaleOptions options_;
    double scale_;
    int64_t clean_ = 0, skipped_ = 0;
};

}  // namespace qk::nn
