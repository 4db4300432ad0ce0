// Autoregressive sampling from a GPT.
#pragma once

#include <functional>
#include <vector>

#include "core/rng.h"
#include "nn/gpt.h"

namespace qk::nn {

// More tokens than this in one call is a typo (at a few hundred tokens per second it would run for
// an hour); callers refuse it up front.
inline constexpr int64_t kMaxSampleTokens = 1'000'000;

struct SampleOptions {
    int64_t max_new_tokens = 300;
    double temperature = 0.8;  // 0 = greedy
    int64_t top_k = 0;         // 0 = no top-k filtering
    // Draw among the ids below this only: the tokenizer's, when the model's embedding has more
    // rows (a fine-tuned import reading bytes; Qwen3's 151,936 rows for 151,669 tokens). 0 = all.
    int64_t vocab = 0;
};

// Refuses options outside their range with a qk::Error naming the flag: max_new_tokens in
// [0, kMaxSampleTokens], temperature finite and >= 0, top_k >= 0.
void check_sample_options(const SampleOptions& options);

// Extends `prompt` (token ids, at least one) by max_new_tokens; the context is cropped to the
// last block_size tokens. Runs in eval mode without gradient. on_token, when given, sees each new
// token as soon as it is drawn (streaming). Logits with a NaN or Inf stop it with a qk::Error:
// a broken model never samples as if it were a working one.
std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, const SampleOptions& options,
                              Generator& gen,
                              const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace qk::nn
