// Autoregressive sampling from a GPT.
#pragma once

#include <vector>

#include "core/rng.h"
#include "nn/gpt.h"

namespace qk::nn {

struct SampleOptions {
    int64_t max_new_tokens = 300;
    double temperature = 0.8;  // 0 = greedy
    int64_t top_k = 0;         // 0 = no top-k filtering
};

// Extends `prompt` (token ids, at least one) by max_new_tokens; the context is cropped to the
// last block_size tokens. Runs in eval mode without gradient.
std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, const SampleOptions& options,
                              Generator& gen);

}  // namespace qk::nn
