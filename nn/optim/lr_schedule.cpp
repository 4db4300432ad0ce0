// The cosine and warmup-stable-decay schedules (declared, with their shapes, in lr_schedule.h).
#include "nn/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace qk::nn {

namespace {

// The linear warmup both schedules share, for step < warmup: lr_max / warmup, 2 lr_max / warmup,
// ..., lr_max.
double warmup_lr(int64_t step, int64_t warmup, double lr_max) {
    return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
}

}  // namespace

double cosine_lr(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
    if (step < warmup) return warmup_lr(step, warmup, lr_max);
    if (step >= total) return lr_min;
    const double progress = static_cast<double>(step - warmup) /
                            static_cast<double>(std::max<int64_t>(total - warmup, 1));
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + std::cos(std::numbers::pi * progress));
}

double wsd_lr(int64_t step, int64_t warmup, int64_t cooldown, int64_t total, double lr_max,
              double lr_min) {
    if (step < warmup) return warmup_lr(step, warmup, lr_max);
    if (step >= total) return lr_min;
    const int64_t decay_start = std::max(total - cooldown, warmup);
    if (step < decay_start) return lr_max;
    // The cooldown's last step (total - 1) lands one step short of lr_min, as cosine's does.
    const double progress = static_cast<double>(step - decay_start) /
                            static_cast<double>(std::max<int64_t>(total - decay_start, 1));
    return lr_max + (lr_min - lr_max) * progress;
}

}  // namespace qk::nn
