// QK-Clip: the per-head max |s| the forward reports against logits recomputed here from the
// layer's own q and k; the clip brings every head above τ to exactly τ on the same batch and
// leaves every other weight bit for bit; after a real optimizer step the next forward stays at τ
// up to the step's own effect; the trainer applies it every step; bad input.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "helpers.h"
#include "nn/optim/qk_clip.h"
#include "nn/train/run_optimizer.h"
#include "ops/elementwise.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using qk::test::throws_with;

namespace {

constexpr int64_t kB = 2, kT = 7, kH = 3, kD = 4, kC = kH * kD;

GPTConfig clip_config(int64_t layers) {
    GPTConfig c;
    c.vocab_size = 11, c.block_size = 8, c.n_layer = layers, c.n_head = kH, c.n_embd = kC;
    c.qk_norm = QKNorm::none;
    return c;
}

Tensor batch_ids() { return from_ids({1, 5, 2, 9, 3, 3, 7, 0, 4, 10, 6, 8, 2, 1}, {kB, kT}); }

// Multiplies c_attn's q and k weights of every layer by a different factor per head, so that
// the heads' max logits lie far apart (some above any τ of interest, some below).
void spread_heads(GPT& model) {
    NoGradGuard no_grad;
    for (auto& block : model.h)
        for (int64_t h = 0; h < kH; ++h)
            for (int64_t begin : {h * kD, kC + h * kD}) {
                const Tensor rows = block->attn->c_attn->weight.detach().narrow(0, begin, kD);
                copy_into(rows, rows * (4.0 + 12.0 * static_cast<double>(h)));
            }
}

// Layer 0's max |q·k| / sqrt(D) per head over the batch and the causal positions, from the
// embeddings, ln_1 and c_attn run one by one, and plain loops.
std::vector<double> reference_head_max(GPT& model, const Tensor& ids) {
    NoGradGuard no_grad;
    std::vector<int32_t> positions(kT);
    for (int64_t t = 0; t < kT; ++t) positions[t] = static_cast<int32_t>(t);
    const Tensor x = model.wte->forward(ids) + model.wpe->forward(from_ids(positions, {kT}));
    const auto qkv = model.h[0]
                         ->attn->c_attn->forward(model.h[0]->ln_1->forward(x))
                         .to_vector<double>();  // (B, T, 3C)
    std::vector<double> head_max(kH, 0.0);
    for (int64_t b = 0; b < kB; ++b)
        for (int64_t h = 0; h < kH; ++h)
            for (int64_t i = 0; i < kT; ++i)
                for (int64_t j = 0; j <= i; ++j) {
                    double s = 0;
                    for (int64_t d = 0; d < kD; ++d)
                        s += qkv[(b * kT + i) * 3 * kC + h * kD + d] *
                             qkv[(b * kT + j) * 3 * kC + kC + h * kD + d];
                    s /= std::sqrt(static_cast<double>(kD));
                    head_max[h] = std::max(head_max[h], std::abs(s));
                }
    return head_max;
}

std::vector<std::vector<double>> head_maxima(GPT& model, const Tensor& ids) {
    NoGradGuard no_grad;
    std::vector<std::vector<double>> out;
    for (const AttentionStats& s : model.forward(ids, {}, true).stats)
        out.push_back(s.head_max_logit);
    return out;
}

}  // namespace

TEST_CASE("the forward's per-head max |s| equals the logits recomputed from q and k") {
    for (const bool fused : {true, false}) {
        CAPTURE(fused);
        GPTConfig c = clip_config(1);
        c.fused_attention = fused;
        GPT model(c, 3, kF64);
        spread_heads(model);
        const Tensor ids = batch_ids();
        const std::vector<double> expected = reference_head_max(model, ids);
        const std::vector<double> got = head_maxima(model, ids)[0];
        REQUIRE(got.size() == kH);
        for (int64_t h = 0; h < kH; ++h)
            CHECK(got[h] == doctest::Approx(expected[h]).epsilon(1e-12));
        CHECK(expected[2] > 2 * expected[0]);  // the heads are far apart, as the tests below need
    }
}

TEST_CASE("qk_clip brings each head above tau to exactly tau and leaves the rest bit for bit") {
    GPT model(clip_config(2), 4, kF64);
    spread_heads(model);
    const Tensor ids = batch_ids();
    NoGradGuard no_grad;
    const GPTOutput before = model.forward(ids, {}, true);
    const std::vector<std::vector<double>> max_before = head_maxima(model, ids);
    // τ between the smallest and the largest head max: some heads clip, some do not.
    std::vector<double> all;
    for (const auto& layer : max_before) all.insert(all.end(), layer.begin(), layer.end());
    std::sort(all.begin(), all.end());
    const double tau = 0.5 * (all[1] + all[2]);
    int64_t above = 0;
    for (double m : all) above += m > tau;
    REQUIRE((above >= 2 && above <= 4));

    std::vector<std::vector<double>> params_before;
    for (const auto& [name, p] : model.named_parameters())
        params_before.push_back(p.to_vector<double>());
    CHECK(qk_clip(model, before.stats, tau) == above);

    // Only the clipped heads' q and k rows (weights and biases) changed.
    const auto named = model.named_parameters();
    for (size_t i = 0; i < named.size(); ++i) {
        const std::string& name = named[i].first;
        CAPTURE(name);
        const std::vector<double> now = named[i].second.to_vector<double>();
        const bool c_attn = name.find("c_attn") != std::string::npos;
        const size_t layer = name.find("h.1.") != std::string::npos ? 1 : 0;
        const int64_t row_length = named[i].second.dim() == 2 ? kC : 1;
        for (size_t e = 0; e < now.size(); ++e) {
            const int64_t row = static_cast<int64_t>(e) / row_length;
            const bool qk_row = c_attn && row < 2 * kC;
            const bool clipped = qk_row && max_before[layer][(row % kC) / kD] > tau;
            if (clipped)
                CHECK(now[e] == doctest::Approx(params_before[i][e] *
                                                std::sqrt(tau / max_before[layer][(row % kC) / kD]))
                                    .epsilon(1e-15));
            else
                CHECK(now[e] == params_before[i][e]);  // bit for bit
        }
    }
    // The same batch again: clipped heads at τ, the others exactly as before. Layer 1's input
    // changed with layer 0's attention, so only layer 0's unclipped heads keep their values.
    const std::vector<std::vector<double>> max_after = head_maxima(model, ids);
    for (int64_t h = 0; h < kH; ++h) {
        CAPTURE(h);
        if (max_before[0][h] > tau)
            CHECK(max_after[0][h] == doctest::Approx(tau).epsilon(1e-12));
        else
            CHECK(max_after[0][h] == max_before[0][h]);
    }
    // A second clip with the new maxima changes nothing in layer 0.
    const std::vector<double> layer0 = model.h[0]->attn->c_attn->weight.to_vector<double>();
    const GPTOutput again = model.forward(ids, {}, true);
    qk_clip(model, again.stats, tau * (1 + 1e-9));
    CHECK(model.h[0]->attn->c_attn->weight.to_vector<double>() == layer0);
}

TEST_CASE("with a key head shared by query heads, qk_clip puts tau / S on the query rows alone") {
    GPTConfig c = clip_config(1);
    c.n_kv_head = 1;  // c_attn: q (kC rows), then one head of k (kD rows) and of v (kD rows)
    GPT model(c, 4, kF64);
    NoGradGuard no_grad;
    const Tensor& w = model.h[0]->attn->c_attn->weight;
    for (int64_t h = 0; h < kH; ++h) {  // the query heads far apart
        const Tensor rows = w.detach().narrow(0, h * kD, kD);
        copy_into(rows, rows * (4.0 + 12.0 * static_cast<double>(h)));
    }
    const Tensor ids = batch_ids();
    const GPTOutput before = model.forward(ids, {}, true);
    const std::vector<double> max_before = before.stats[0].head_max_logit;
    const double tau = 0.5 * (max_before[0] + max_before[1]);  // heads 1 and 2 above
    REQUIRE(max_before[2] > tau);
    const std::vector<double> kv_before = w.narrow(0, kC, 2 * kD).to_vector<double>();
    CHECK(qk_clip(model, before.stats, tau) == 2);
    CHECK(w.narrow(0, kC, 2 * kD).to_vector<double>() == kv_before);  // k, v rows untouched
    const std::vector<double> max_after = head_maxima(model, ids)[0];
    CHECK(max_after[0] == max_before[0]);  // bit for bit: its q rows and the shared k unchanged
    CHECK(max_after[1] == doctest::Approx(tau).epsilon(1e-12));
    CHECK(max_after[2] == doctest::Approx(tau).epsilon(1e-12));
}

TEST_CASE("after a Muon or AdamW step and the clip, the next forward's max is tau up to the step") {
    for (const bool muon : {false, true}) {
        CAPTURE(muon);
        GPT model(clip_config(1), 5, kF64);
        spread_heads(model);
        const Tensor ids = batch_ids(),
                     targets = from_ids({5, 2, 9, 3, 3, 7, 0, 10, 6, 8, 2, 1, 4, 4}, {kB, kT});
        RunOptimizerOptions options;
        options.muon = muon;
        RunOptimizer opt(model.named_parameters(), options);
        const GPTOutput out = model.forward(ids, targets, true);
        out.loss.backward();
        const std::vector<double> head_max = out.stats[0].head_max_logit;
        const double tau = 0.5 * (*std::min_element(head_max.begin(), head_max.end()) +
                                  *std::max_element(head_max.begin(), head_max.end()));
        opt.step(1e-4);
        opt.zero_grad();
        CHECK(qk_clip(model, out.stats, tau) >= 1);
        const std::vector<double> after = head_maxima(model, ids)[0];
        for (int64_t h = 0; h < kH; ++h) {
            CAPTURE(h);
            if (head_max[h] > tau)
                CHECK(after[h] == doctest::Approx(tau).epsilon(2e-2));  // the step's effect
            else
                CHECK(after[h] < tau);
        }
    }
}

TEST_CASE("qk_clip refuses QK-norm models, a bad tau and stats of another model") {
    GPTConfig normed = clip_config(1);
    normed.qk_norm = QKNorm::layernorm;
    GPT with_norm(normed, 1, kF64);
    CHECK(throws_with([&] { qk_clip(with_norm, {}, 10); }, {"qk_clip", "qk_norm layernorm"}));
    GPT model(clip_config(2), 1, kF64);
    const GPTOutput out = model.forward(batch_ids(), {}, true);
    CHECK(throws_with([&] { qk_clip(model, out.stats, 0); }, {"tau", "> 0", "got 0"}));
    CHECK(throws_with([&] { qk_clip(model, out.stats, NAN); }, {"tau", "got nan"}));
    CHECK(throws_with([&] { qk_clip(model, {out.stats[0]}, 1); }, {"stats of 2 layers, got 1"}));
    std::vector<AttentionStats> wrong = out.stats;
    wrong[1].head_max_logit.pop_back();
    CHECK(throws_with([&] { qk_clip(model, wrong, 1); }, {"layer 1", "2 heads", "3 heads"}));
}

TEST_CASE("train with --qk-clip: heads are clipped exactly when the step's max passed tau") {
    qk::test::TempDir dir("qk_clip_train");
    auto run = [&](const std::string& name, double tau) {
        TrainConfig cfg = qk::test::tiny_run(dir, name);
        cfg.model.qk_norm = QKNorm::none;
        cfg.steps = 40, cfg.stats_every = 1, cfg.sample_tokens = 0, cfg.qk_clip = tau;
        REQUIRE(!train(cfg).diverged);
        std::vector<nlohmann::json> lines;
        std::ifstream in(cfg.run_dir + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);)
            lines.push_back(nlohmann::json::parse(line));
        lines.erase(lines.begin());  // step 0: the validation loss at initialisation
        return lines;
    };
    // Each step draws a new batch, so the bound holds on the batch that was clipped (the tests
    // above), not on the next one; over the run the clipped model's logits stay lower.
    const double tau = 0.03;
    double free_max = 0, clipped_max = 0;
    for (const auto& line : run("free", 0)) {
        CHECK(!line.contains("heads_clipped"));
        free_max = std::max(free_max, line["layers"][0]["max_logit"].get<double>());
    }
    int64_t clips = 0;
    for (const auto& line : run("clipped", tau)) {
        const int64_t heads = line["heads_clipped"].get<int64_t>();
        const double max_logit = line["layers"][0]["max_logit"].get<double>();
        CAPTURE(max_logit);
        CHECK((heads > 0) == (max_logit > tau));  // one layer: clipped iff its max passed tau
        CHECK(heads <= 2);
        clipped_max = std::max(clipped_max, max_logit);
        clips += heads;
    }
    CHECK(clips >= 3);
    MESSAGE("max logit over the run: " << free_max << " free, " << clipped_max << " clipped");
    CHECK(free_max > 1.5 * tau);
    CHECK(clipped_max < 0.8 * free_max);
}

TEST_CASE("QK-Clip clips nothing on a step the fp16 loss scaler skipped") {
    // A loss scale of 2^64 makes float16's gradients overflow: every step below is skipped, so
    // nothing may move, the clip included, though every max logit passes tau.
    qk::test::TempDir dir("qk_clip_skipped");
    TrainConfig cfg = qk::test::tiny_run(dir, "skipped");
    cfg.model.qk_norm = QKNorm::none;
    cfg.model.precision = Precision::fp16;
    cfg.loss_scale = 0x1p64;
    cfg.steps = 3, cfg.stats_every = 1, cfg.sample_tokens = 0, cfg.qk_clip = 0.005;
    REQUIRE(!train(cfg).diverged);
    std::ifstream in(cfg.run_dir + "/metrics.jsonl");
    int64_t steps = 0;
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("skipped")) continue;  // step 0: the validation loss at initialisation
        ++steps;
        CAPTURE(line);
        CHECK(j["layers"][0]["max_logit"].get<double>() > cfg.qk_clip);
        CHECK(j["heads_clipped"].get<int64_t>() == 0);
    }
    CHECK(steps == 3);
}
