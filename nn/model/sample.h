// Autoregressive sampling from a GPT through its KV cache (nn/model/kv_cache.h,
// docs/generation.md).
#pragma once

#include <functional>
#include <vector>

#include "core/rng.h"
#include "nn/model/gpt.h"

namespace qk::nn {

// More tokens than this in one call is a typo (at a few hundred tokens per second it would run for
// an hour); callers refuse it up front.
inline constexpr int64_t kMaxSampleTokens = 1'000'000;

// What generation does when the context is full (block_size positions): slide, keeping the last
// half of the tokens as a new prompt (prefilled again: RoPE positions restart, as they must for a
// model that never saw positions past block_size), or stop there.
enum class WhenFull { slide, stop };

// The filters apply in transformers' order: the repetition penalty on the logits, then the
// temperature, top-k, top-p and min-p, then one draw from what is left.
struct SampleOptions {
    int64_t max_new_tokens = 300;
    double temperature = 0.8;  // 0 = greedy (the filters below then change nothing)
    int64_t top_k = 0;         // keep the k most likely ids; 0 = all
    // Draw among the ids below this only: the tokenizer's, when the model's embedding has more
    // rows (a fine-tuned import reading bytes; Qwen3's 151,936 rows for 151,669 tokens). 0 = all.
    int64_t vocab = 0;
    double top_p = 1.0;  // keep the smallest set of most likely ids whose probability is >= p
    double min_p = 0.0;  // drop ids less likely than min_p × the most likely one's probability
    // CTRL's penalty on every id already in the context: a positive logit divided by it, a
    // negative one multiplied (1 = off, > 1 discourages repeats).
    double repetition_penalty = 1.0;
    WhenFull when_full = WhenFull::slide;
};

// Refuses options outside their range with a qk::Error naming the flag: max_new_tokens in
// [0, kMaxSampleTokens], temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in
// [0, 1), repetition_penalty finite and > 0.
void check_sample_options(const SampleOptions& options);

// One id drawn from a row of logits (the context: the ids the repetition penalty looks at).
int32_t sample_token(std::vector<double> logits, const std::vector<int32_t>& context,
                     const SampleOptions& options, Generator& gen);

// Extends `prompt` (token ids, 1 to block_size of them) by up to max_new_tokens: one prefill,
// then one cached step per token. Runs in eval mode without gradient. on_token, when given, sees
// each new token as soon as it is drawn (streaming) and returns whether to go on (a stop string
// seen by the caller, say). Logits with a NaN or Inf stop it with a qk::Error: a broken model never
// samples as if it were a working one.
std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, const SampleOptions& options,
                              Generator& gen,
                              const std::function<bool(int32_t)>& on_token = nullptr);

// Several prompts at once (a batch with per-sequence lengths): each prompt prefilled on its own,
// then every running sequence decoded in one cached step per token (its GEMMs batched, its
// attention over its own keys). Sequence s draws from gens[s] only, so each gets the tokens it
// would get alone with that generator. on_token(s, id) streams sequence s's tokens and returns
// whether s goes on; a sequence that stops leaves the batch. Returns each prompt extended.
std::vector<std::vector<int32_t>> generate(
    GPT& model, std::vector<std::vector<int32_t>> prompts, const SampleOptions& options,
    std::vector<Generator>& gens, const std::function<bool(int64_t, int32_t)>& on_token = nullptr);

}  // namespace qk::nn
