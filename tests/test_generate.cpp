// Generation through the KV cache (nn/model/kv_cache.h, GPT::forward_cached): at every position the
// cached logits equal a full recompute's, for every attention variant and family block, whether
// the tokens arrive one at a time or in chunks, in float64 (1e-12), float32 (1e-5) and bf16
// GEMMs; sliding layers wrap their ring; a batch of sequences of different lengths gives each
// the logits it gets alone; and what does not fit or is malformed is a clean error.
#include <algorithm>
#include <cmath>

#include "core/factory.h"
#include "core/rng.h"
#include "cuda_parity.h"
#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/model/kv_cache.h"
#include "nn/model/sample.h"
#include "nn_variants.h"

using namespace qk;
using namespace qk::nn;
using namespace qk::test;

namespace {

// A variant at a size where caches and windows matter: 12 positions, 2 layers, random ids.
GPTConfig generation_config(const Variant& variant) {
    GPTConfig c = tiny_config();
    c.block_size = 12, c.vocab_size = 11;
    variant.apply(c);
    return c;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
    Generator gen(seed);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = static_cast<int32_t>(gen.uniform() * double(vocab));
    return ids;
}

// Gains and biases drawn away from their 1 / 0 start, so that a norm the cached path skipped,
// or applied twice, shows in the logits.
void randomise_norms(GPT& model) {
    Generator gen(99);
    NoGradGuard no_grad;
    for (const auto& [name, p] : model.named_parameters())
        if (p.dim() == 1 && name.find("qk_scale") == std::string::npos)
            copy_into(p, p + randn(p.shape(), p.dtype(), gen) * 0.3);
}

// Runs `ids` through the cache in chunks of the given sizes, checking each chunk's logits
// against the full recompute's rows; returns the largest relative error.
double cached_error(GPT& model, const std::vector<int32_t>& ids,
                    const std::vector<int64_t>& chunks) {
    const int64_t T = static_cast<int64_t>(ids.size());
    const Tensor full = model.forward(from_ids(ids, {1, T})).logits;  // (1, T, V)
    KVCache cache(model.config(), 1, model.config().block_size, model.wte->weight.dtype());
    double worst = 0;
    int64_t at = 0;
    for (const int64_t n : chunks) {
        const std::vector<int32_t> part(ids.begin() + at, ids.begin() + at + n);
        const Tensor logits = model.forward_cached(from_ids(part, {1, n}), cache, {}, false);
        worst = std::max(worst, relative_error(logits, full.narrow(1, at, n)));
        at += n;
    }
    CHECK(cache.length(0) == at);
    return worst;
}

}  // namespace

TEST_CASE("cached logits equal the full recompute at every position, every variant (f64)") {
    for (const Variant& variant : variants()) {
        CAPTURE(variant.name);
        GPT model(generation_config(variant), 5, kF64);
        randomise_norms(model);
        model.eval();
        const std::vector<int32_t> ids = random_ids(11, 11, 3);
        // One token at a time (decode), a prompt then single tokens, uneven chunks.
        CHECK(cached_error(model, ids, std::vector<int64_t>(11, 1)) <= 1e-12);
        CHECK(cached_error(model, ids, {6, 1, 1, 1, 1, 1}) <= 1e-12);
        CHECK(cached_error(model, ids, {3, 5, 2, 1}) <= 1e-12);
    }
}

TEST_CASE("cached logits in float32 and with bf16 GEMMs, fused and naive attention") {
    for (const Variant& variant : variants()) {
        CAPTURE(variant.name);
        for (const auto& [precision, fused, tolerance] :
             {std::tuple{Precision::full, true, 1e-5}, std::tuple{Precision::full, false, 1e-5},
              std::tuple{Precision::bf16, true, 1e-5}}) {
            CAPTURE(to_string(precision));
            CAPTURE(fused);
            GPTConfig c = generation_config(variant);
            c.precision = precision, c.fused_attention = fused;
            GPT model(c, 5);
            randomise_norms(model);
            model.eval();
            const std::vector<int32_t> ids = random_ids(12, 11, 4);
            CHECK(cached_error(model, ids, std::vector<int64_t>(12, 1)) <= tolerance);
            CHECK(cached_error(model, ids, {5, 4, 3}) <= tolerance);
        }
    }
}

TEST_CASE("a batch of sequences of different lengths: each gets the logits it gets alone") {
    GPTConfig c = generation_config(variants().back());  // Gemma 3's block: a sliding layer
    c.pos_emb = PosEmb::learned;                         // and each sequence's own positions
    GPT model(c, 8, kF64);
    randomise_norms(model);
    model.eval();
    const std::vector<std::vector<int32_t>> prompts = {random_ids(5, 11, 1), random_ids(2, 11, 2),
                                                       random_ids(7, 11, 3)};
    KVCache batch(c, 3, c.block_size, kF64);
    std::vector<std::vector<int32_t>> sequences = prompts;
    std::vector<int32_t> next;
    for (int64_t s = 0; s < 3; ++s) {  // prefill each prompt on its own
        const auto& p = prompts[static_cast<size_t>(s)];
        const Tensor logits =
            model.forward_cached(from_ids(p, {1, static_cast<int64_t>(p.size())}), batch, {s});
        CHECK(logits.shape() == Shape{1, 1, 11});
    }
    // Then three decode steps together, fed a fixed token each; each row checked against a
    // recompute of its own sequence.
    for (int step = 0; step < 3; ++step) {
        std::vector<int32_t> tokens = {1, 4, 9};
        const Tensor logits = model.forward_cached(from_ids(tokens, {3, 1}), batch);  // (3, 1, V)
        for (size_t s = 0; s < 3; ++s) {
            CAPTURE(s);
            sequences[s].push_back(tokens[s]);
            const int64_t T = static_cast<int64_t>(sequences[s].size());
            const Tensor full = model.forward(from_ids(sequences[s], {1, T})).logits;
            CHECK(relative_error(logits.narrow(0, static_cast<int64_t>(s), 1),
                                 full.narrow(1, T - 1, 1)) <= 1e-12);
            CHECK(batch.length(static_cast<int64_t>(s)) == T);
        }
    }
    // A subset of the batch continues alone (the others finished).
    const Tensor two = model.forward_cached(from_ids({2, 3}, {2, 1}), batch, {2, 0});
    CHECK(two.shape() == Shape{2, 1, 11});
    CHECK(batch.length(1) == 5);
    CHECK(batch.length(0) == 9);
}

TEST_CASE("the KV cache refuses what does not fit, by name") {
    GPTConfig c = generation_config(variants().front());
    GPT model(c, 1);
    model.eval();
    KVCache cache(c, 1, 8);
    CHECK(throws_with(
        [&] {
            model.forward_cached(from_ids(random_ids(9, 11, 1), {1, 9}), cache);
        },
        {"0 of 8 positions", "9 more do not fit"}));
    model.forward_cached(from_ids(random_ids(8, 11, 1), {1, 8}), cache);
    CHECK(throws_with(
        [&] {
            model.forward_cached(from_ids({1}, {1, 1}), cache);
        },
        {"8 of 8 positions", "1 more"}));
    CHECK(throws_with([&] { KVCache(c, 1, 13); }, {"capacity", "block_size 12", "13"}));
    CHECK(throws_with([&] { KVCache(c, 0, 4); }, {"batch must be >= 1"}));
    KVCache two(c, 2, 4);
    CHECK(throws_with(
        [&] {
            model.forward_cached(from_ids({1, 2}, {2, 1}), two, {0, 0});
        },
        {"sequence 0 appears twice"}));
    CHECK(throws_with(
        [&] {
            model.forward_cached(from_ids({1}, {1, 1}), two, {2});
        },
        {"sequence 2 of a batch of 2"}));
    model.train();
    CHECK(throws_with([&] { model.forward_cached(from_ids({1}, {1, 1}), two, {0}); }, {"eval()"}));
}

// ---- decoding --------------------------------------------------------------------------------

namespace {

// Greedy decoding without a cache: each token from a full forward over the sequence so far.
std::vector<int32_t> greedy_by_recompute(GPT& model, std::vector<int32_t> ids, int64_t n) {
    NoGradGuard no_grad;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t T = static_cast<int64_t>(ids.size());
        const Tensor last = model.forward(from_ids(ids, {1, T}))
                                .logits.select(1, -1)
                                .reshape({model.config().vocab_size});
        const std::vector<double> row = last.to_vector<double>();
        ids.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    }
    return ids;
}

}  // namespace

TEST_CASE("greedy decoding through the cache gives the recompute's tokens, every family") {
    for (const Variant& variant : variants()) {
        CAPTURE(variant.name);
        GPT model(generation_config(variant), 6, kF64);
        randomise_norms(model);
        model.eval();
        Generator gen(1);
        const std::vector<int32_t> prompt = random_ids(3, 11, 9);
        CHECK(generate(model, prompt, {.max_new_tokens = 9, .temperature = 0}, gen) ==
              greedy_by_recompute(model, prompt, 9));
    }
}

TEST_CASE("at the context limit: slide keeps the last half and goes on, stop stops") {
    GPTConfig c = generation_config(variants()[14]);  // RoPE: positions restart when sliding
    GPT model(c, 2, kF64);
    {  // weights 25 times larger than their init: the earlier tokens sway the prediction
        NoGradGuard no_grad;
        for (const Tensor& p : model.parameters()) copy_into(p, p * 25.0);
    }
    model.eval();
    Generator gen(1);
    const std::vector<int32_t> prompt = random_ids(10, 11, 2);
    const auto slid = generate(model, prompt, {.max_new_tokens = 8, .temperature = 0}, gen);
    REQUIRE(slid.size() == 18);
    // Tokens 11-13 come from contexts of 10-12 tokens; the context is then full, and token 14
    // comes from the last 6 tokens alone, prefilled from position 0.
    const std::vector<int32_t> first12(slid.begin(), slid.begin() + 12);
    CHECK(std::vector<int32_t>(slid.begin(), slid.begin() + 13) ==
          greedy_by_recompute(model, prompt, 3));
    const std::vector<int32_t> tail(slid.begin() + 7, slid.begin() + 13);
    CHECK(slid[13] == greedy_by_recompute(model, tail, 1).back());
    // The full-context prediction and the slid one differ for this model, so the check above
    // tells a slide from a missing one.
    CHECK(greedy_by_recompute(model, std::vector<int32_t>(slid.begin() + 1, slid.begin() + 13), 1)
              .back() != slid[13]);
    const auto stopped = generate(
        model, prompt, {.max_new_tokens = 8, .temperature = 0, .when_full = WhenFull::stop}, gen);
    CHECK(stopped.size() == 13);  // the 13th token is drawn from a full context, then it stops
    CHECK(throws_with([&] { generate(model, random_ids(13, 11, 1), {}, gen); },
                      {"13 tokens", "context of 12"}));
    // on_token returning false ends it there (a stop string, to the caller).
    int seen = 0;
    const auto three =
        generate(model, prompt, {.max_new_tokens = 8}, gen, [&](int32_t) { return ++seen < 3; });
    CHECK(three.size() == 13);
    CHECK(first12.size() == 12);
}

TEST_CASE(
    "sample_token: top-k, top-p, min-p and the repetition penalty against their definitions") {
    // Logits whose probabilities at temperature 1 are 0.5, 0.25, 0.125, 0.0625, 0.0625.
    const std::vector<double> logits = {std::log(8.0), std::log(4.0), std::log(2.0), 0.0, 0.0};
    auto counts = [&](SampleOptions o, const std::vector<int32_t>& context = {}) {
        o.temperature = 1.0;
        Generator gen(11);
        std::vector<int> n(5, 0);
        for (int i = 0; i < 20000; ++i)
            ++n[static_cast<size_t>(sample_token(logits, context, o, gen))];
        return n;
    };
    const auto all = counts({});
    CHECK(std::abs(all[0] / 20000.0 - 0.5) < 0.015);
    CHECK(std::abs(all[3] / 20000.0 - 0.0625) < 0.01);
    const auto k2 = counts({.top_k = 2});  // 0.5 and 0.25, renormalised: 2/3, 1/3
    CHECK(k2[2] + k2[3] + k2[4] == 0);
    CHECK(std::abs(k2[0] / 20000.0 - 2.0 / 3.0) < 0.015);
    // top-p 0.7: 0.5 < 0.7, so 0.25 joins; then 0.75 >= 0.7 and the set is closed.
    const auto p7 = counts({.top_p = 0.7});
    CHECK(p7[2] + p7[3] + p7[4] == 0);
    CHECK(p7[1] > 0);
    const auto p5 = counts({.top_p = 0.5});  // the first alone reaches 0.5
    CHECK(p5[0] == 20000);
    // min-p 0.2: kept while p >= 0.2 · 0.5 = 0.1: the first three.
    const auto m = counts({.min_p = 0.2});
    CHECK(m[3] + m[4] == 0);
    CHECK(m[2] > 0);
    // An id exactly at the floor stays (p >= floor, not >): min-p set to ids 3 and 4's relative
    // probability as the sampler computes it, exp(0 − ln 8), so the two are equal to the last bit.
    const auto at_floor = counts({.min_p = std::exp((0.0 - std::log(8.0)) / 1.0)});
    CHECK(at_floor[3] > 0);
    CHECK(at_floor[4] > 0);
    // The penalty: id 0's logit ln 8 divided by ln 8 / ln 2 becomes ln 2, below id 1's ln 4.
    Generator gen(1);
    const SampleOptions greedy{.temperature = 0,
                               .repetition_penalty = std::log(8.0) / std::log(2.0)};
    CHECK(sample_token(logits, {}, greedy, gen) == 0);
    CHECK(sample_token(logits, {0, 0, 0}, greedy, gen) == 1);
    // Once per id, not per occurrence: ln 8 / 1.2 = 1.73 still beats ln 4 = 1.39, where three
    // divisions (ln 8 / 1.728 = 1.20) would not.
    const SampleOptions mild{.temperature = 0, .repetition_penalty = 1.2};
    CHECK(sample_token(logits, {0, 0, 0}, mild, gen) == 0);
    const std::vector<double> negative = {-1.0, -1.5};
    CHECK(sample_token(negative, {0}, {.temperature = 0, .repetition_penalty = 2.0}, gen) == 1);
}

TEST_CASE("sampling options out of range are refused by flag name") {
    for (const auto& [options, says] :
         {std::pair{SampleOptions{.top_p = 0}, "--top-p must be in (0, 1]"},
          std::pair{SampleOptions{.top_p = 1.5}, "--top-p"},
          std::pair{SampleOptions{.min_p = 1}, "--min-p must be in [0, 1)"},
          std::pair{SampleOptions{.min_p = -0.1}, "--min-p"},
          std::pair{SampleOptions{.repetition_penalty = 0}, "--repetition-penalty"},
          std::pair{SampleOptions{.repetition_penalty = NAN}, "--repetition-penalty"}}) {
        CAPTURE(says);
        CHECK(throws_with([&] { check_sample_options(options); }, {says}));
    }
}

TEST_CASE("the cache on the CUDA backend: cached logits equal the cpu's recompute (families)") {
    if (!cuda_runnable()) return;
    // The three families' blocks: grouped-query heads, full-width norms, a wrapping ring.
    for (const Variant& variant : variants()) {
        if (variant.name.rfind("qwen3", 0) != 0 && variant.name.rfind("olmo2", 0) != 0 &&
            variant.name.rfind("gemma3", 0) != 0 && variant.name != "l2 per-head scale")
            continue;
        CAPTURE(variant.name);
        GPT model(generation_config(variant), 5);
        randomise_norms(model);
        model.eval();
        const std::vector<int32_t> ids = random_ids(9, 11, 4);
        const Tensor full = model.forward(from_ids(ids, {1, 9})).logits;  // on the cpu
        model.to(Device::cuda);
        KVCache cache(model.config(), 1, model.config().block_size, kF32, Device::cuda);
        int64_t at = 0;
        for (const int64_t n : {4, 1, 1, 3}) {
            const std::vector<int32_t> part(ids.begin() + at, ids.begin() + at + n);
            const Tensor logits =
                model.forward_cached(from_ids(part, {1, n}).to(Device::cuda), cache, {}, false);
            CHECK(logits.device() == Device::cuda);
            CHECK(relative_error(logits.to(Device::cpu), full.narrow(1, at, n)) <= 1e-5);
            at += n;
        }
    }
}

TEST_CASE("several prompts decode together: each gets the tokens it gets alone with its seed") {
    // Prompts of 2, 7 and 10 tokens in a 12-position context: the third slides mid-way, the
    // second stops early through on_token, so the batch shrinks and its sequences drift apart.
    for (const Variant& variant : variants()) {
        if (variant.name != "none" && variant.name.rfind("rope, layernorm head", 0) != 0 &&
            variant.name.rfind("olmo2", 0) != 0 && variant.name.rfind("gemma3", 0) != 0)
            continue;
        CAPTURE(variant.name);
        GPT model(generation_config(variant), 6, kF64);
        randomise_norms(model);
        const std::vector<std::vector<int32_t>> prompts = {
            random_ids(2, 11, 1), random_ids(7, 11, 2), random_ids(10, 11, 3)};
        const SampleOptions options{.max_new_tokens = 9, .temperature = 1.0, .top_k = 6};
        auto stop_second = [](int64_t s, int64_t drawn) { return s != 1 || drawn < 3; };
        std::vector<Generator> gens = {Generator(40), Generator(41), Generator(42)};
        std::vector<int64_t> drawn(3, 0);
        const auto together = generate(model, prompts, options, gens, [&](int64_t s, int32_t) {
            return stop_second(s, ++drawn[static_cast<size_t>(s)]);
        });
        REQUIRE(together.size() == 3);
        CHECK(together[0].size() == 2 + 9);
        CHECK(together[1].size() == 7 + 3);
        for (int64_t s = 0; s < 3; ++s) {
            Generator gen(40 + static_cast<uint64_t>(s));
            int64_t alone_drawn = 0;
            CHECK(generate(model, prompts[static_cast<size_t>(s)], options, gen, [&](int32_t) {
                      return stop_second(s, ++alone_drawn);
                  }) == together[static_cast<size_t>(s)]);
        }
    }
    GPT model(generation_config(variants()[0]), 6);
    std::vector<Generator> one(1);
    CHECK(throws_with(
        [&] {
            generate(model, {{1, 2}, {3}}, {}, one);
        },
        {"2 prompts need one generator each, got 1"}));
    std::vector<Generator> two(2);
    CHECK(throws_with(
        [&] {
            generate(model, {{1, 2}, {}}, {}, two);
        },
        {"prompt 1 must hold at least one token"}));
}

TEST_CASE("bf16-stored weights: the logits of bf16 GEMMs on float32 weights, bit for bit") {
    for (const Variant& variant : variants()) {  // biases or none, tied or not, GQA, windows
        if (variant.name != "none" && variant.name.rfind("logit softcap", 0) != 0 &&
            variant.name.rfind("qwen3", 0) != 0 && variant.name.rfind("olmo2", 0) != 0 &&
            variant.name.rfind("gemma3", 0) != 0)
            continue;
        CAPTURE(variant.name);
        GPTConfig c = generation_config(variant);
        c.precision = Precision::bf16;
        GPT reference(c, 5), stored(c, 5);
        randomise_norms(reference), randomise_norms(stored);
        reference.eval(), stored.eval();
        const int64_t f32_bytes = stored.weight_bytes_per_token();
        stored.store_weights_bf16();
        // The matrices halve; gains, biases and the embedding lookups stay float32; a tied head
        // reads its bf16 copy of the table (an untied one its own matrix, and no copy is made).
        int64_t f32_expected = c.tie_embeddings ? c.vocab_size * c.n_embd * 4 : 0,
                bf16_expected = c.tie_embeddings ? c.vocab_size * c.n_embd * 2 : 0;
        for (const auto& [name, p] : reference.named_parameters()) {
            if (name == "transformer.wte.weight" || name == "transformer.wpe.weight") continue;
            f32_expected += p.numel() * 4;
            bf16_expected += p.numel() * (p.dim() == 2 ? 2 : 4);
        }
        CHECK(f32_bytes == f32_expected);
        CHECK(stored.weight_bytes_per_token() == bf16_expected);
        CHECK(stored.weight_bytes_per_token() < f32_bytes * 0.6);
        CHECK(stored.h[0]->mlp->parameters()[0].dtype() == kBF16);
        CHECK(stored.wte->weight.dtype() == kF32);
        const std::vector<int32_t> ids = random_ids(9, 11, 4);
        NoGradGuard no_grad;
        const Tensor want = reference.forward(from_ids(ids, {1, 9})).logits;
        CHECK(max(abs(stored.forward(from_ids(ids, {1, 9})).logits - want)).item() == 0.0);
        KVCache cache(c, 1, c.block_size);
        const Tensor cached = stored.forward_cached(from_ids(ids, {1, 9}), cache, {}, false);
        CHECK(relative_error(cached, want) <= 1e-5);
        if (cuda_runnable()) {  // the same bf16 matrices through the CUDA backend's GEMMs
            stored.to(Device::cuda);
            const Tensor on_cuda = stored.forward(from_ids(ids, {1, 9}).to(Device::cuda)).logits;
            CHECK(relative_error(on_cuda.to(Device::cpu), want) <= 1e-5);
        }
    }
    GPTConfig c = generation_config(variants()[0]);
    GPT fp32_model(c, 5);
    CHECK(throws_with([&] { fp32_model.store_weights_bf16(); },
                      {"bf16-stored weights are for bf16 inference", "fp32"}));
    c.precision = Precision::bf16;
    GPT model(c, 5);
    model.store_weights_bf16();
    model.train();
    const std::vector<int32_t> ids = random_ids(4, 11, 4);
    CHECK(throws_with(
        [&] {
            model.forward(from_ids(ids, {1, 4}), from_ids(ids, {1, 4}));
        },
        {"bfloat16-stored weight", "takes no gradient"}));
}
