#include "nn/model/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "nn/model/kv_cache.h"

namespace qk::nn {

namespace {

// A NaN would fall through every comparison below and come out as the last token of the
// vocabulary, again and again: refuse it, naming where the sample stopped.
void check_finite(const std::vector<double>& logits, int64_t token) {
    for (size_t i = 0; i < logits.size(); ++i)
        QK_CHECK(std::isfinite(logits[i]),
                 "sample: the model's logits are not finite (logit {} of token {} is {}); its "
                 "weights hold a NaN or Inf",
                 i, token, logits[i]);
}

// logits -> probabilities of the ids that survive top-k, top-p and min-p (the others 0).
std::vector<double> filtered_probabilities(std::vector<double> logits,
                                           const SampleOptions& options) {
    const int64_t V = static_cast<int64_t>(logits.size());
    const bool filtered =
        (options.top_k > 0 && options.top_k < V) || options.top_p < 1 || options.min_p > 0;
    if (!filtered) {  // every id stays: no ranking of the vocabulary on every token
        const double top = *std::max_element(logits.begin(), logits.end());
        for (double& l : logits) l = std::exp((l - top) / options.temperature);
        return logits;
    }
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const double top = logits[order[0]];
    std::vector<double> p(logits.size());
    double total = 0;
    for (size_t i = 0; i < p.size(); ++i)
        total += (p[i] = std::exp((logits[i] - top) / options.temperature));
    const int64_t k = options.top_k > 0 ? std::min(options.top_k, V) : V;
    double kept_mass = 0;
    const double floor = options.min_p * p[order[0]];  // p[order[0]] = 1 before normalising
    for (int64_t rank = 0; rank < V; ++rank) {
        const int32_t id = order[static_cast<size_t>(rank)];
        // The most likely id always survives; the others while every filter lets them through.
        const bool keep =
            rank == 0 || (rank < k && kept_mass < options.top_p * total && p[id] >= floor);
        if (keep)
            kept_mass += p[id];
        else
            p[id] = 0;
    }
    return p;
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
    QK_CHECK(options.top_p > 0 && options.top_p <= 1,
             "sample: --top-p must be in (0, 1] (1 = off), got {}", options.top_p);
    QK_CHECK(options.min_p >= 0 && options.min_p < 1,
             "sample: --min-p must be in [0, 1) (0 = off), got {}", options.min_p);
    QK_CHECK(std::isfinite(options.repetition_penalty) && options.repetition_penalty > 0,
             "sample: --repetition-penalty must be a finite number > 0 (1 = off), got {}",
             options.repetition_penalty);
    QK_CHECK(options.vocab >= 0, "sample: the vocabulary limit must be >= 0 (0 = all), got {}",
             options.vocab);
}

int32_t sample_token(std::vector<double> logits, const std::vector<int32_t>& context,
                     const SampleOptions& options, Generator& gen) {
    if (options.repetition_penalty != 1.0) {
        // Once per id, however often it occurs (transformers gathers the distinct ids too).
        std::vector<bool> seen(logits.size(), false);
        for (const int32_t id : context)
            if (id >= 0 && id < static_cast<int32_t>(logits.size()) && !seen[id]) {
                seen[static_cast<size_t>(id)] = true;
                double& l = logits[static_cast<size_t>(id)];
                l = l > 0 ? l / options.repetition_penalty : l * options.repetition_penalty;
            }
    }
    if (options.temperature <= 0)
        return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                    logits.begin());
    const std::vector<double> p = filtered_probabilities(std::move(logits), options);
    double u = gen.uniform() * std::accumulate(p.begin(), p.end(), 0.0);
    int32_t last = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == 0) continue;
        last = static_cast<int32_t>(i);
        if ((u -= p[i]) < 0) return last;
    }
    return last;  // rounding left u a hair above 0: the last surviving id
}

namespace {

// One sequence of a batched generation.
struct Sequence {
    std::vector<int32_t> tokens;
    Tensor logits;  // (1, 1, V): the next token's, once prefilled or stepped
    int64_t drawn = 0;
    bool done = false;
};

void check_prompts(const std::vector<std::vector<int32_t>>& prompts, int64_t block, size_t gens) {
    QK_CHECK(!prompts.empty(), "generate: no prompt given");
    QK_CHECK(gens == prompts.size(), "generate: {} prompts need one generator each, got {}",
             prompts.size(), gens);
    for (size_t s = 0; s < prompts.size(); ++s) {
        QK_CHECK(!prompts[s].empty(), "generate: prompt {} must hold at least one token", s);
        QK_CHECK(static_cast<int64_t>(prompts[s].size()) <= block,
                 "generate: prompt {} holds {} tokens, more than the model's context of {}", s,
                 prompts[s].size(), block);
    }
}

}  // namespace

std::vector<std::vector<int32_t>> generate(GPT& model, std::vector<std::vector<int32_t>> prompts,
                                           const SampleOptions& options,
                                           std::vector<Generator>& gens,
                                           const std::function<bool(int64_t, int32_t)>& on_token) {
    const int64_t block = model.config().block_size, V = model.config().vocab_size;
    check_prompts(prompts, block, gens.size());
    check_sample_options(options);
    NoGradGuard no_grad;
    const bool was_training = model.training();
    model.eval();
    const int64_t B = static_cast<int64_t>(prompts.size());
    // Room for the longest prompt and every new token, at most the context: Qwen3's 40,960
    // positions would be 9 GB of float32 keys and values, for a sample of a few hundred tokens.
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    const int64_t capacity =
        std::min(block, static_cast<int64_t>(longest) + options.max_new_tokens);
    KVCache cache(model.config(), B, capacity, model.wte->weight.dtype(), model.device());
    std::vector<Sequence> seqs(static_cast<size_t>(B));
    // A prompt, or the last half of a full context when sliding: prefilled from position 0, one
    // sequence at a time (prompts differ in length; a prefill is GEMM-bound anyway).
    auto prefill = [&](int64_t s, size_t first) {
        Sequence& q = seqs[static_cast<size_t>(s)];
        cache.reset(s);
        const std::vector<int32_t> part(q.tokens.begin() + static_cast<std::ptrdiff_t>(first),
                                        q.tokens.end());
        q.logits = model.forward_cached(
            from_ids(part, {1, static_cast<int64_t>(part.size())}).to(model.device()), cache, {s});
    };
    for (int64_t s = 0; s < B; ++s) {
        seqs[static_cast<size_t>(s)].tokens = std::move(prompts[static_cast<size_t>(s)]);
        seqs[static_cast<size_t>(s)].done = options.max_new_tokens == 0;
        if (!seqs[static_cast<size_t>(s)].done) prefill(s, 0);
    }
    // Each round draws one token for every running sequence, then steps all that go on together.
    for (;;) {
        std::vector<int64_t> step;  // the sequences decoded together this round
        for (int64_t s = 0; s < B; ++s) {
            Sequence& q = seqs[static_cast<size_t>(s)];
            if (q.done) continue;
            std::vector<double> row = q.logits.reshape({V}).to_vector<double>();
            if (options.vocab > 0) row.resize(static_cast<size_t>(std::min(options.vocab, V)));
            check_finite(row, q.drawn);
            q.tokens.push_back(
                sample_token(std::move(row), q.tokens, options, gens[static_cast<size_t>(s)]));
            q.done =
                (on_token && !on_token(s, q.tokens.back())) || ++q.drawn == options.max_new_tokens;
            if (q.done) continue;
            if (cache.room(s) > 0)
                step.push_back(s);
            else if (options.when_full == WhenFull::slide)
                prefill(s, q.tokens.size() - static_cast<size_t>(std::max<int64_t>(1, block / 2)));
            else
                q.done = true;
        }
        if (std::all_of(seqs.begin(), seqs.end(), [](const Sequence& q) { return q.done; })) break;
        if (step.empty()) continue;
        std::vector<int32_t> last;
        for (const int64_t s : step) last.push_back(seqs[static_cast<size_t>(s)].tokens.back());
        const Tensor logits = model.forward_cached(
            from_ids(last, {static_cast<int64_t>(step.size()), 1}).to(model.device()), cache,
            step);  // (rows, 1, V)
        for (size_t row = 0; row < step.size(); ++row)
            seqs[static_cast<size_t>(step[row])].logits =
                logits.narrow(0, static_cast<int64_t>(row), 1);
    }
    model.train(was_training);
    std::vector<std::vector<int32_t>> out;
    for (Sequence& q : seqs) out.push_back(std::move(q.tokens));
    return out;
}

std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, const SampleOptions& options,
                              Generator& gen, const std::function<bool(int32_t)>& on_token) {
    std::vector<Generator> gens{gen};
    auto tokens = generate(model, {std::move(prompt)}, options, gens,
                           on_token ? [&](int64_t, int32_t id) { return on_token(id); }
                                    : std::function<bool(int64_t, int32_t)>());
    gen = gens[0];
    return std::move(tokens[0]);
}

}  // namespace qk::nn
