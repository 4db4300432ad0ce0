#include "nn/sample.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/factory.h"

namespace qk::nn {

namespace {

// Draws an index from the logits row: temperature, optional top-k, then inverse-CDF sampling.
int32_t draw(std::vector<double> logits, const SampleOptions& options, Generator& gen) {
    if (options.temperature <= 0)
        return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                    logits.begin());
    if (options.top_k > 0 && options.top_k < static_cast<int64_t>(logits.size())) {
        std::vector<double> sorted = logits;
        std::nth_element(sorted.begin(), sorted.begin() + options.top_k - 1, sorted.end(),
                         std::greater<>());
        const double threshold = sorted[options.top_k - 1];
        for (double& l : logits)
            if (l < threshold) l = -INFINITY;
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (double& l : logits) total += (l = std::exp((l - top) / options.temperature));
    double u = gen.uniform() * total;
    for (size_t i = 0; i < logits.size(); ++i)
        if ((u -= logits[i]) < 0) return static_cast<int32_t>(i);
    return static_cast<int32_t>(logits.size() - 1);
}

// A NaN would fall through every comparison below and come out as the last token of the
// vocabulary, again and again: refuse it, naming where the sample stopped.
void check_finite(const std::vector<double>& logits, int64_t token) {
    for (size_t i = 0; i < logits.size(); ++i)
        QK_CHECK(std::isfinite(logits[i]),
                 "sample: the model's logits are not finite (logit {} of token {} is {}); its "
                 "weights hold a NaN or Inf",
                 i, token, logits[i]);
}

}  // namespace

void check_sample_options(const SampleOptions& options) {
    QK_CHECK(options.max_new_tokens >= 0 && options.max_new_tokens <= kMaxSampleTokens,
             "sample: --tokens must be in [0, {}], got {}", kMaxSampleTokens,
             options.max_new_tokens);
    QK_CHECK(std::isfinite(options.temperature) && options.temperature >= 0,
             "sample: --temperature must be a finite number >= 0 (0 = greedy), got {}",
             options.temperature);
    QK_CHECK(options.top_k >= 0, "sample: --top-k must be >= 0 (0 = all), got {}", options.top_k);
    QK_CHECK(options.vocab >= 0, "sample: the vocabulary limit must be >= 0 (0 = all), got {}",
             options.vocab);
}

std::vector<int32_t> generate(GPT& model, std::vector<int32_t> tokens, const SampleOptions& options,
                              Generator& gen, const std::function<void(int32_t)>& on_token) {
    QK_CHECK(!tokens.empty(), "generate: the prompt must hold at least one token");
    check_sample_options(options);
    NoGradGuard no_grad;
    const bool was_training = model.training();
    model.eval();
    const int64_t block = model.config().block_size, V = model.config().vocab_size;
    for (int64_t n = 0; n < options.max_new_tokens; ++n) {
        const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - block);
        std::vector<int32_t> context(tokens.begin() + start, tokens.end());
        Tensor ids =
            from_ids(context, {1, static_cast<int64_t>(context.size())}).to(model.device());
        Tensor logits = model.forward(ids).logits;  // (1, T, V)
        Tensor last = logits.select(1, -1).reshape({V});
        std::vector<double> row = last.to_vector<double>();
        if (options.vocab > 0) row.resize(std::min<int64_t>(options.vocab, V));
        check_finite(row, n);
        tokens.push_back(draw(std::move(row), options, gen));
        if (on_token) on_token(tokens.back());
    }
    model.train(was_training);
    return tokens;
}

}  // namespace qk::nn
