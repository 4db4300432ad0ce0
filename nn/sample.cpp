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

}  // namespace

std::vector<int32_t> generate(GPT& model, std::vector<int32_t> tokens, const SampleOptions& options,
                              Generator& gen) {
    QK_CHECK(!tokens.empty(), "generate: the prompt must hold at least one token");
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
        tokens.push_back(draw(last.to_vector<double>(), options, gen));
    }
    model.train(was_training);
    return tokens;
}

}  // namespace qk::nn
