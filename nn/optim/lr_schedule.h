// The learning-rate schedules the trainer offers: step -> learning rate, pure functions of the
// step and the run's length. They live apart from the optimizers so that code which only reads a
// run's settings (TrainConfig, the config fuzzer) need not link them.
#pragma once

#include <cstdint>

namespace qk::nn {

// Linear warmup from 0 to lr_max over warmup steps, then cosine decay to lr_min at total steps.
double cosine_lr(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min);
// Warmup-stable-decay (the "trapezoid" of the modded-nanoGPT speedruns): the same linear warmup,
// lr_max held, then a straight line from lr_max to lr_min over the last cooldown steps, reaching
// lr_min at total. The long flat stretch keeps the step size up for most of a short run; the
// final decay is where the loss drops (Hägele et al. 2024 find it matches cosine at any length).
double wsd_lr(int64_t step, int64_t warmup, int64_t cooldown, int64_t total, double lr_max,
              double lr_min);

}  // namespace qk::nn
