// The `cuda_model` suite: the tiny GPT of tests/test_nn.cpp trained on cuda (in the emulation
// build: every kernel of the backend, run on the cpu with block semantics) against the same model
// trained on the cpu. Both start from the same seed; the cuda one has its parameters moved to the
// device. Over the first steps the losses must agree within f32 tolerance (the kernels sum in
// other orders, and real nvcc contracts to fma), and after 30 AdamW steps the cuda model must
// have overfitted the fixed batch as the cpu one does. One variant adds QK-LayerNorm and dropout,
// whose masks are drawn on the cpu from the model's generator, so both devices drop the same
// activations.
#include <cmath>

#include "cuda_parity.h"
#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"
#include "nn/train/checkpoint.h"
#include "nn/train/trainer.h"

using namespace qk;
using namespace qk::nn;
using qk::test::cuda_runnable;

namespace {

// The batch of test_nn.cpp's overfit test: row b is (8 + b, 0, 1, ..., 6) and every target is
// 8 + b, so only attention back to position 0 can fit it.
struct Batch {
    Tensor ids, targets;
};
Batch fixed_batch(int64_t B, int64_t T) {
    std::vector<int32_t> x, y;
    for (int32_t b = 0; b < B; ++b)
        for (int32_t t = 0; t < T; ++t) {
            x.push_back(t == 0 ? 8 + b : t - 1);
            y.push_back(8 + b);
        }
    return {from_ids(x, {B, T}), from_ids(y, {B, T})};
}

// The losses of `steps` AdamW steps on `device`.
std::vector<double> train(const GPTConfig& config, Device device, int steps) {
    GPT model(config, 7);
    model.to(device);
    for (const Tensor& p : model.parameters()) REQUIRE(p.device() == device);
    const Batch batch = fixed_batch(8, config.block_size);
    const Tensor ids = batch.ids.to(device), targets = batch.targets.to(device);
    AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0});
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
        GPTOutput out = model.forward(ids, targets);
        REQUIRE(out.logits.device() == device);
        losses.push_back(out.cross_entropy.item());
        out.loss.backward();
        opt.step(1e-2);
        opt.zero_grad();
    }
    return losses;
}

// The first `close_steps` losses must agree within `close_rtol`. float32 runs: 5 steps, 1e-4.
// bf16 runs: 3 steps, 1e-3. There a float32 value one ulp apart on the two devices now and then
// rounds to the other bf16 neighbour (a 2^-9 relative step of that element), and AdamW's first
// steps, nearly sign-like, turn such differences into whole-lr updates: measured on this model,
// the cpu against itself with the other bf16 engine (oneDNN vs the float32 fallback, the same
// math summed in another order) already differs by 2.4e-3 at step 4 and 3e-3 at step 5, while
// steps 0-2 agree within 3e-4 on every engine and device.
void check_variant(const GPTConfig& config, int close_steps = 5, double close_rtol = 1e-4) {
    const int steps = 30;
    const std::vector<double> cpu = train(config, Device::cpu, steps);
    const std::vector<double> dev = train(config, Device::cuda, steps);
    // The first steps: the same trajectory. Later the two drift apart slowly, as two runs that
    // sum in different orders do, so only the end point is compared there.
    for (int step = 0; step < close_steps; ++step) {
        CAPTURE(step);
        CHECK(dev[step] == doctest::Approx(cpu[step]).epsilon(close_rtol));
    }
    CHECK(dev[0] == doctest::Approx(std::log(16.0)).epsilon(0.05));  // uniform at init
    CHECK(cpu.back() < 0.1 * cpu[0]);
    CHECK(dev.back() < 0.1 * dev[0]);  // overfitted on cuda too
    CHECK(dev.back() == doctest::Approx(cpu.back()).epsilon(0.05));
    MESSAGE("loss after " << steps << " steps: cpu " << cpu.back() << ", cuda " << dev.back());
}

GPTConfig tiny_config() {
    GPTConfig c;
    c.vocab_size = 16, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 32;
    return c;
}

}  // namespace

TEST_CASE("the tiny GPT on cuda follows the cpu's losses and overfits a fixed batch") {
    if (!cuda_runnable()) return;
    check_variant(tiny_config());
}

TEST_CASE("the tiny GPT with QK-LayerNorm and dropout on cuda follows the cpu's losses") {
    if (!cuda_runnable()) return;
    GPTConfig c = tiny_config();
    c.qk_norm = QKNorm::layernorm;
    c.dropout = 0.1;
    check_variant(c);
}

TEST_CASE("the tiny GPT with RoPE on cuda follows the cpu's losses, in both norm orders") {
    if (!cuda_runnable()) return;
    for (QKNormOrder order : {QKNormOrder::before_rope, QKNormOrder::after_rope}) {
        CAPTURE(to_string(order));
        GPTConfig c = tiny_config();
        c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::rmsnorm, c.qk_norm_order = order;
        check_variant(c);
    }
}

TEST_CASE("the tiny GPT with gated MLPs on cuda follows the cpu's losses") {
    if (!cuda_runnable()) return;
    for (MLPKind mlp : {MLPKind::swiglu, MLPKind::geglu}) {
        CAPTURE(to_string(mlp));
        GPTConfig c = tiny_config();
        c.mlp = mlp, c.mlp_hidden = 40, c.qk_norm = QKNorm::rmsnorm;
        check_variant(c);
    }
}

TEST_CASE("the tiny GPT with the Qwen3, OLMo 2 and Gemma 3 switches on cuda follows the cpu") {
    // Grouped-query heads with a free head size, post-norm with a full-width QK-norm over a
    // narrower k, and pre+post (1 + w) norms with a sliding window on layer 0.
    if (!cuda_runnable()) return;
    GPTConfig qwen = tiny_config();
    qwen.n_kv_head = 1, qwen.head_size = 10, qwen.qk_norm = QKNorm::rmsnorm;
    qwen.pos_emb = PosEmb::rope, qwen.mlp = MLPKind::swiglu, qwen.bias = false;
    GPTConfig olmo = qwen;
    olmo.head_size = 0, olmo.norm_placement = NormPlacement::post;
    olmo.qk_norm_scope = NormScope::full;
    GPTConfig gemma = qwen;
    gemma.norm_placement = NormPlacement::both, gemma.norm_unit_offset = true;
    gemma.embedding_scale = std::sqrt(32.0), gemma.sliding_window = 3;
    gemma.layer_types = "sliding,full", gemma.rope_local_theta = 100;
    gemma.query_pre_attn_scalar = 16, gemma.mlp = MLPKind::geglu;
    for (const GPTConfig& c : {qwen, olmo, gemma}) check_variant(c);
}

TEST_CASE("the tiny GPT in bf16 mixed precision on cuda follows the cpu's bf16 losses") {
    if (!cuda_runnable()) return;
    GPTConfig c = tiny_config();
    c.qk_norm = QKNorm::layernorm;
    c.precision = Precision::bf16;
    check_variant(c, 3, 1e-3);
}

TEST_CASE("train() on cuda: the same losses as on the cpu, checkpoints that load on the cpu") {
    if (!cuda_runnable()) return;
    // The second case: Muon (Newton-Schulz on cuBLAS) and QK-Clip (scaling rows of c_attn).
    for (const bool muon : {false, true}) {
        CAPTURE(muon);
        qk::test::TempDir dir("cuda_train");
        TrainConfig cfg;
        cfg.model.block_size = 8, cfg.model.n_layer = 1, cfg.model.n_head = 2,
        cfg.model.n_embd = 16;
        cfg.model.qk_norm = QKNorm::layernorm;
        if (muon) cfg.model.qk_norm = QKNorm::none, cfg.optimizer = "muon", cfg.qk_clip = 0.02;
        cfg.data_path = qk::test::write_corpus(dir);
        cfg.batch_size = 2, cfg.steps = 4, cfg.warmup = 1, cfg.lr = 1e-2, cfg.lr_min = 1e-3;
        cfg.eval_every = 2, cfg.eval_batches = 1, cfg.stats_every = 2;
        cfg.checkpoint_every = 2, cfg.keep_checkpoints = 1, cfg.sample_tokens = 5;
        cfg.progress = false;
        TrainConfig on_cuda = cfg;
        cfg.run_dir = dir / "cpu";
        on_cuda.run_dir = dir / "cuda", on_cuda.device = "cuda";
        const TrainResult a = qk::nn::train(cfg), b = qk::nn::train(on_cuda);
        REQUIRE((!a.diverged && !b.diverged && b.steps_done == 4));
        CHECK(b.final_loss == doctest::Approx(a.final_loss).epsilon(1e-4));
        CHECK(b.final_val_loss == doctest::Approx(a.final_val_loss).epsilon(1e-4));
        CHECK(b.sample.size() == 6);
        CHECK(load_run_config(on_cuda.run_dir).device == "cuda");
        // The checkpoint is an ordinary file: it loads into a cpu model with the cuda run's
        // weights.
        LoadedModel loaded = load_model(latest_model_checkpoint(on_cuda.run_dir));
        CHECK(loaded.model->device() == Device::cpu);
        // Resuming the cuda run from its step-4 checkpoint changes nothing and reports its losses.
        TrainConfig again = load_run_config(on_cuda.run_dir);
        again.progress = false;
        CHECK(qk::nn::train(again, true).final_val_loss == b.final_val_loss);
    }
}
