// Mixed precision (--precision bf16) in the model: the GEMMs see bf16-rounded inputs, everything
// else stays float32; fused and naive attention agree; the stability signals measure the logits
// the softmax sees; a training run tracks its float32 twin; the config round-trips.
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "nn/model/gpt.h"
#include "ops/gemm.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;

namespace {

GPTConfig small_config(Precision precision) {
    GPTConfig c;
    c.vocab_size = 11, c.block_size = 12, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
    c.qk_norm = QKNorm::layernorm;
    c.precision = precision;
    return c;
}

void batch(Tensor& ids, Tensor& targets) {
    Generator gen(5);
    std::vector<int32_t> x, y;
    for (int i = 0; i < 3 * 12; ++i) x.push_back(static_cast<int32_t>(gen.uniform() * 11));
    for (int i = 0; i < 3 * 12; ++i) y.push_back(static_cast<int32_t>(gen.uniform() * 11));
    ids = from_ids(x, {3, 12});
    targets = from_ids(y, {3, 12});
}

// Loss and every gradient of a freshly built model (seed 3).
std::pair<double, std::vector<Tensor>> loss_and_grads(const GPTConfig& c) {
    Tensor ids, targets;
    batch(ids, targets);
    GPT model(c, 3);
    GPTOutput out = model.forward(ids, targets);
    out.loss.backward();
    std::vector<Tensor> grads;
    for (const auto& [name, p] : model.named_parameters()) grads.push_back(p.grad());
    return {out.loss.item(), grads};
}

}  // namespace

TEST_CASE("bf16 model: close to float32 but not equal; fused and naive attention agree") {
    const auto [loss32, grads32] = loss_and_grads(small_config(Precision::full));
    const auto [loss16, grads16] = loss_and_grads(small_config(Precision::bf16));
    CHECK(loss16 != loss32);                  // the rounding is real ...
    CHECK(std::abs(loss16 - loss32) < 2e-3);  // ... and small at initialisation
    double worst_relative = 0;
    for (size_t i = 0; i < grads32.size(); ++i) {
        const double scale = std::max(1e-3, test::max_abs_diff(grads32[i], zeros_like(grads32[i])));
        worst_relative =
            std::max(worst_relative, test::max_abs_diff(grads16[i], grads32[i]) / scale);
    }
    CHECK(worst_relative < 0.05);  // bf16's 2^-9 input rounding, through two layers
    // The naive path multiplies p, dO and dS rounded too (autocast's rule, and the tensor-core
    // kernel's), where the cpu's fused kernel keeps them float32: perturbations of the same
    // 2^-9 size as the roundings above, on three operands of the attention's GEMMs, so the two
    // paths agree within the same bounds (the naive path's exact composition is checked above).
    GPTConfig naive = small_config(Precision::bf16);
    naive.fused_attention = false;
    const auto [loss_naive, grads_naive] = loss_and_grads(naive);
    CHECK(loss_naive != loss16);
    CHECK(std::abs(loss_naive - loss16) < 2e-3);
    double worst_naive = 0;
    for (size_t i = 0; i < grads16.size(); ++i) {
        const double scale = std::max(1e-3, test::max_abs_diff(grads16[i], zeros_like(grads16[i])));
        worst_naive = std::max(worst_naive, test::max_abs_diff(grads_naive[i], grads16[i]) / scale);
    }
    MESSAGE("bf16 vs float32: worst relative gradient difference ", worst_relative,
            "; naive vs fused at bf16: ", worst_naive, " (loss ", std::abs(loss_naive - loss16),
            ")");
    CHECK(worst_naive < worst_relative);  // three roundings move it less than all of them
}

TEST_CASE("naive attention at bf16 multiplies rounded operands: q, k, v, p, and dO and dS back") {
    // Every GEMM of the composition takes bf16 operands, as autocast's and the tensor-core
    // kernel's do: s = g·(q̃·k̃ᵀ), y = p̃·ṽ, and backward dP = dÕ·ṽᵀ, dV = p̃ᵀ·dÕ, dQ = g·dS̃·k̃,
    // dK = g·dS̃ᵀ·q̃. The reference writes each rounding out in float32 ops; with the float32
    // engine the bf16 GEMMs sum the same exact products in the same order as sgemm does.
    const cpu::Bf16GemmEngine engine = cpu::bf16_gemm_engine();
    cpu::set_bf16_gemm_engine(cpu::Bf16GemmEngine::float32_sgemm);
    Generator gen(9);
    const Tensor q = normal({2, 2, 9, 8}, 0, 2, kF32, gen),
                 k = normal({2, 2, 9, 8}, 0, 2, kF32, gen);
    const Tensor v = normal({2, 2, 9, 8}, 0, 1, kF32, gen),
                 r = normal({2, 2, 9, 8}, 0, 1, kF32, gen);
    Tensor ql = q.detach().requires_grad_(), kl = k.detach().requires_grad_();
    Tensor vl = v.detach().requires_grad_();
    const Tensor y = attention_unfused(ql, kl, vl, {.causal = true, .precision = Precision::bf16});
    sum(y * r).backward();
    cpu::set_bf16_gemm_engine(engine);

    auto round = [](const Tensor& t) { return t.detach().to(kBF16).to(kF32); };
    const double g = 1.0 / std::sqrt(8.0);
    Tensor s = (matmul(round(q), round(k).transpose(-2, -1)) * g).requires_grad_();
    const Tensor p = softmax(s, {.causal = true});
    const Tensor y_ref = matmul(round(p), round(v));
    CHECK(test::max_abs_diff(y, y_ref) == 0);
    const Tensor d_out = round(r);
    const Tensor dp = matmul(d_out, round(v).transpose(-2, -1));
    sum(p * dp).backward();  // s.grad() = dS, softmax's backward of dP
    const Tensor ds = round(s.grad());
    CHECK(test::max_abs_diff(vl.grad(), matmul(round(p).transpose(-2, -1), d_out)) == 0);
    CHECK(test::max_abs_diff(ql.grad(), matmul(ds, round(k)) * g) == 0);
    CHECK(test::max_abs_diff(kl.grad(), matmul(ds.transpose(-2, -1), round(q)) * g) == 0);
    // The rounding of p is real: float32 probabilities give another output.
    CHECK(test::max_abs_diff(y, matmul(p.detach(), round(v))) > 0);
}

TEST_CASE("bf16 attention measures the logits of the rounded q and k") {
    Generator gen(8);
    Tensor q = normal({2, 2, 9, 8}, 0, 3, kF32, gen), k = normal({2, 2, 9, 8}, 0, 3, kF32, gen);
    Tensor v = normal({2, 2, 9, 8}, 0, 1, kF32, gen);
    AttentionOptions bf16{.causal = true, .precision = Precision::bf16};
    AttentionOptions full{.causal = true};
    AttentionSignals s16, s_rounded;
    Tensor y16 = attention(q, k, v, bf16, &s16);
    auto round = [](const Tensor& t) { return t.to(kBF16).to(kF32); };
    Tensor y_rounded = attention(round(q), round(k), round(v), full, &s_rounded);
    CHECK(test::max_abs_diff(y16, y_rounded) == 0);
    CHECK(test::max_abs_diff(s16.max_abs_logit, s_rounded.max_abs_logit) == 0);
    AttentionSignals s32;
    Tensor y32 = attention(q, k, v, full, &s32);
    CHECK(test::max_abs_diff(s16.max_abs_logit, s32.max_abs_logit) > 0);
    // Against float32: logits of size ~|q||k|/sqrt(8) ≈ 25 move by ~2^-8 of themselves (0.1),
    // which moves the softmax's weights by about as much; the outputs (|v| ~ 1) by well under 0.1.
    const double logit_shift = test::max_abs_diff(s16.max_abs_logit, s32.max_abs_logit);
    MESSAGE("bf16 vs float32: max logit moves by ", logit_shift, ", output by ",
            test::max_abs_diff(y16, y32));
    CHECK(logit_shift < 0.01 * max(s32.max_abs_logit).item());
    CHECK(test::max_abs_diff(y16, y32) < 0.1);
    // The gradients pass the rounding straight through, unrounded: those of float32 attention
    // at the rounded point, bit for bit.
    Tensor r = normal({2, 2, 9, 8}, 0, 1, kF32, gen);
    Tensor ql = q.detach().requires_grad_(), kl = k.detach().requires_grad_();
    Tensor vl = v.detach().requires_grad_();
    sum(attention(ql, kl, vl, bf16) * r).backward();
    Tensor qr = round(q).requires_grad_(), kr = round(k).requires_grad_();
    Tensor vr = round(v).requires_grad_();
    sum(attention(qr, kr, vr, full) * r).backward();
    CHECK(test::max_abs_diff(ql.grad(), qr.grad()) == 0);
    CHECK(test::max_abs_diff(kl.grad(), kr.grad()) == 0);
    CHECK(test::max_abs_diff(vl.grad(), vr.grad()) == 0);
    CHECK(test::max_abs_diff(ql.grad(), round(ql.grad())) > 0);  // not rounded to bf16
    CHECK(test::throws_with([&] { (void)attention(q.to(kF64), k.to(kF64), v.to(kF64), bf16); },
                            {"attention", "bf16", "float32"}));
}

TEST_CASE("a bf16 training run tracks its float32 twin step by step") {
    test::TempDir dir("mixed_precision");
    std::vector<std::vector<double>> losses;
    for (const char* precision : {"fp32", "bf16"}) {
        TrainConfig cfg = test::tiny_run(dir, precision);
        cfg.model.precision = parse_precision(precision);
        cfg.steps = 40, cfg.checkpoint_every = 40, cfg.sample_tokens = 0;
        TrainResult r = train(cfg);
        REQUIRE(!r.diverged);
        losses.emplace_back();
        std::ifstream in(cfg.run_dir + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
            auto j = nlohmann::json::parse(line);
            if (j.contains("loss")) losses.back().push_back(j.at("loss").get<double>());
        }
        // The checkpoint records the precision; the weights stay float32.
        const std::string model_file = latest_model_checkpoint(cfg.run_dir);
        REQUIRE(!model_file.empty());
        SafetensorsFile f = load_safetensors(model_file);
        CHECK(f.metadata.at("precision") == precision);
        CHECK(f.tensors.front().second.dtype() == kF32);
    }
    REQUIRE(losses[0].size() == 40);
    REQUIRE(losses[1].size() == 40);
    double worst = 0;
    for (size_t i = 0; i < 40; ++i) worst = std::max(worst, std::abs(losses[0][i] - losses[1][i]));
    MESSAGE("max |loss bf16 - loss fp32| over 40 steps: ", worst);
    CHECK(worst > 0);
    CHECK(worst < 0.02);
}

TEST_CASE("precision in the config: string form, old checkpoints, bad values, float64 refused") {
    GPTConfig c = small_config(Precision::bf16);
    auto fields = c.to_strings();
    CHECK(fields.at("precision") == "bf16");
    CHECK(GPTConfig::from_strings(fields).precision == Precision::bf16);
    fields.erase("precision");  // written before mixed precision: float32
    CHECK(GPTConfig::from_strings(fields).precision == Precision::full);
    fields["precision"] = "fp4";
    CHECK(test::throws_with([&] { (void)GPTConfig::from_strings(fields); },
                            {"precision", "fp4", "fp32, bf16, fp16"}));
    CHECK(test::throws_with([&] { GPT model(c, 1, kF64); }, {"bf16", "float64"}));
}
