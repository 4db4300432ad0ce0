// The `cuda_ledger` suite: the launch ledger (cuda/ledger.h) and the GPU cost model
// (cuda/cost_model.h), in the emulation build, where every launch is recorded as under nvcc.
// Structural checks of a training step that fail on waste: the optimizer's passes take a fixed
// number of launches whatever the number of parameters, every launch declares its cost, and the
// cost model ranks a one-block pass over a large input far behind a full grid's.
#include <algorithm>
#include <set>

#include "cuda/cost_model.h"
#include "cuda/ledger.h"
#include "cuda_parity.h"
#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/optim/muon.h"
#include "nn/optim/optim.h"
#include "nn_variants.h"

using namespace qk;
using qk::test::cuda_runnable;
namespace ledger = qk::cuda::ledger;
namespace cost = qk::cuda::cost;

namespace {

long count(const std::vector<ledger::Entry>& entries, const std::string& prefix) {
    long n = 0;
    for (const ledger::Entry& e : entries) n += e.name.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
}

// Two rows of block_size ids on cuda, id i of the batch being i · stride mod the vocabulary.
Tensor cyclic_batch(const nn::GPTConfig& config, int64_t stride) {
    std::vector<int32_t> ids(2 * config.block_size);
    for (size_t i = 0; i < ids.size(); ++i)
        ids[i] = int32_t(int64_t(i) * stride % config.vocab_size);
    return from_ids(ids, {2, config.block_size}).to(Device::cuda);
}

// The forward and backward of a tiny bf16 GPT on cuda, under a ledger (dry: recorded, not run).
std::vector<ledger::Entry> forward_backward_ledger(bool dry_run) {
    nn::GPTConfig config = test::tiny_config();
    config.precision = Precision::bf16;
    nn::GPT model(config, 3);
    model.to(Device::cuda);
    const Tensor x = cyclic_batch(config, 5);
    ledger::open(false, dry_run);
    model.forward(x, x).loss.backward();
    return ledger::close();
}

// The last of `steps` bf16 training steps of a tiny GPT on cuda, under the ledger (the first
// step also makes each weight's bf16 copy, which the optimizer keeps current after it); dry: the
// launches recorded, not run.
std::vector<ledger::Entry> step_ledger(nn::GPTConfig config, int64_t layers, int steps = 1,
                                       int64_t* parameter_count = nullptr, bool dry_run = false) {
    config.n_layer = layers;
    config.precision = Precision::bf16;
    nn::GPT model(config, 3);
    model.to(Device::cuda);
    nn::AdamW opt(model.parameters(), {.lr = 1e-3});
    const Tensor x = cyclic_batch(config, 7);
    if (parameter_count) *parameter_count = 0;
    for (const Tensor& p : model.parameters())
        if (parameter_count) *parameter_count += p.numel();
    for (int step = 0; step < steps; ++step) {
        ledger::open(false, dry_run);
        nn::GPTOutput out = model.forward(x, x);
        out.loss.backward();
        // Small: the clip scales every gradient (a dry run's norm is garbage: no throw on it).
        nn::clip_grad_norm(model.parameters(), 1e-3, /*throw_on_nonfinite=*/!dry_run);
        opt.step(1e-3);
        opt.zero_grad();
        if (step + 1 < steps) ledger::close();
    }
    return ledger::close();
}

}  // namespace

TEST_CASE("the ledger records launches only while open, in order, with grid and block") {
    if (!cuda_runnable()) return;
    const Tensor a = full({1000}, 2.0, kF32).to(Device::cuda);
    CHECK_FALSE(ledger::is_open());
    (void)(a * 3.0);  // not recorded
    ledger::open();
    CHECK(ledger::is_open());
    const Tensor b = a * 3.0;
    const Tensor c = sum(b);
    const auto entries = ledger::close();
    CHECK_FALSE(ledger::is_open());
    REQUIRE(entries.size() >= 2);
    CHECK(entries.front().name.find("unary_forward_kernel") != std::string::npos);
    CHECK(entries.front().blocks() >= 1);
    CHECK(entries.front().declared);
    CHECK(entries.front().bytes == doctest::Approx(8000.0));  // 1000 floats read, 1000 written
    CHECK(entries.front().measured_us < 0);                   // no timing in the emulator
    CHECK(ledger::close().empty());
}

TEST_CASE("a dry run records the launches a real run makes, without running them") {
#ifndef QK_CUDA_EMULATION
    CHECK(test::throws_with([] { ledger::open(false, true); }, {"dry run", "emulation build"}));
    return;
#endif
    if (!cuda_runnable()) return;
    const auto real = forward_backward_ledger(false), dry = forward_backward_ledger(true);
    REQUIRE(real.size() == dry.size());
    for (size_t i = 0; i < real.size(); ++i) {
        CAPTURE(i);
        CHECK(dry[i].name == real[i].name);
        CHECK(dry[i].blocks() == real[i].blocks());
        CHECK(dry[i].bytes == real[i].bytes);
    }
    CHECK_FALSE(ledger::dry_run());  // closed: launches run again
}

TEST_CASE("clipping and AdamW take the same launches for 2 layers and for 4: one pass each") {
    if (!cuda_runnable()) return;
    const nn::GPTConfig config = test::tiny_config();
    const auto two = step_ledger(config, 2), four = step_ledger(config, 4);
    for (const auto* entries : {&two, &four}) {
        CHECK(count(*entries, "(sum_of_squares_kernel") == 1);
        CHECK(count(*entries, "sum_partials_kernel") == 1);
        CHECK(count(*entries, "(scale_kernel") == 1);
        CHECK(count(*entries, "(adamw_update_all_kernel") == 1);
        CHECK(count(*entries, "(adamw_update_kernel") == 0);  // not one launch per tensor
        CHECK(count(*entries, "(reduce_v2_kernel<T, Op>)") <=
              count(four, "(reduce_v2_kernel<T, Op>)"));
    }
    // Each layer adds the same launches: the step grows linearly in layers, and nothing else.
    const long per_layer = long(four.size() - two.size()) / 2;
    MESSAGE("tiny bf16 step: ", two.size(), " launches at 2 layers, ", per_layer, " per layer");
    CHECK(long(four.size()) == long(two.size()) + 2 * per_layer);
}

TEST_CASE("a bf16 step rounds each weight once, in the optimizer's pass: <= the weights' bytes") {
    if (!cuda_runnable()) return;
    // Sizes where no activation has a weight's element count: the weights' roundings are known
    // by their bytes (4 read + 2 written per element), and AdamW declares the copies it writes.
    nn::GPTConfig config = test::tiny_config();
    config.n_embd = 16, config.block_size = 5;
    int64_t P = 0;
    const auto entries = step_ledger(config, 2, /*steps=*/2, &P);
    std::set<double> weight_cast_bytes;
    const nn::GPT shapes(config, 3);
    for (const Tensor& p : shapes.parameters())
        if (p.dim() == 2) weight_cast_bytes.insert(6.0 * double(p.numel()));
    double cast = 0;
    for (const ledger::Entry& e : entries) {
        if (e.name.find("copy_packed") != std::string::npos && weight_cast_bytes.count(e.bytes))
            cast += e.bytes;  // a GEMM rounding a weight
        if (e.name.find("adamw_update_all") != std::string::npos)
            cast += e.bytes - 28.0 * double(P);  // the bf16 copies written beside the weights
    }
    MESSAGE("weight-cast bytes in a step: ", cast, ", the parameters' bytes: ", 4 * P);
    CHECK(cast > 0);
    CHECK(cast <= 4.0 * double(P));
}

TEST_CASE("every launch of a training step declares its cost; no float64 in the optimizer") {
    if (!cuda_runnable()) return;
    const auto entries = step_ledger(test::tiny_config(), 2);
    for (const ledger::Entry& e : entries) {
        CAPTURE(e.name);
        CHECK(e.declared);
        CHECK(e.bytes > 0);
        if (e.name.find("adamw") != std::string::npos ||
            e.name.find("scale_kernel") != std::string::npos)
            CHECK_FALSE(e.float64);
    }
}

TEST_CASE("a GPT-2-wide bf16 step (dry run): big launches fill the GPU, float64 only to combine") {
    if (!cuda_runnable()) return;
#ifndef QK_CUDA_EMULATION
    return;  // a dry run is the emulator's
#endif
    // GPT-2 small's width and context, two layers, B = 8: every per-layer launch at full size
    // (a 6.3 M-element activation, 8 x 12 x 1024 x 1024 attention logits), recorded, not run.
    for (bool fused : {false, true}) {
        CAPTURE(fused);
        nn::GPTConfig config;
        config.vocab_size = 65, config.block_size = 1024, config.n_layer = 2;
        config.n_head = 12, config.n_embd = 768;
        config.qk_norm = nn::QKNorm::layernorm, config.pos_emb = nn::PosEmb::rope;
        config.precision = Precision::bf16, config.fused_attention = fused;
        nn::GPT model(config, 5);
        model.to(Device::cuda);
        nn::AdamW opt(model.parameters(), {.lr = 1e-3});
        std::vector<int32_t> ids(8 * 1024);
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 65);
        const Tensor x = from_ids(ids, {8, 1024}).to(Device::cuda);
        ledger::open(false, /*dry_run=*/true);
        model.forward(x, x).loss.backward();
        nn::clip_grad_norm(model.parameters(), 1.0, /*throw_on_nonfinite=*/false);
        opt.step(1e-3);
        const auto entries = ledger::close();
        // The final combines of two-stage reductions are small by design, and sum in double.
        const std::set<std::string> combines = {
            "sum_partials_kernel", "(reduce_partials_kernel<T, Op>)",
            "(cross_entropy_mean_kernel<T>)", "(attention_scale_combine_kernel<T>)"};
        for (const ledger::Entry& e : entries) {
            CAPTURE(e.name);
            CAPTURE(e.bytes);
            // Every GEMM on cuBLAS's aligned kernels, the head's (V = 65) padded to 128 included.
            if (e.library) CHECK(e.name.find(" unaligned") == std::string::npos);
            if (e.library || combines.count(e.name)) continue;
            if (e.bytes >= 4e6) CHECK(e.blocks() >= 264);  // >= ~1 M values: 2 blocks per SM
            CHECK_FALSE(e.float64);
        }
        // The loss reads the logits once: their gradient comes out of its forward pass.
        const auto launched = [&](const std::string& name) {
            return std::count_if(entries.begin(), entries.end(),
                                 [&](const ledger::Entry& e) { return e.name == name; });
        };
        CHECK(launched("(cross_entropy_forward_gradient_kernel<T>)") == 1);
        CHECK(launched("(cross_entropy_backward_kernel<T>)") == 0);
        const std::string kind = fused ? "fused" : "naive";
        MESSAGE(kind, " attention: ", entries.size(), " launches for 2 layers");
    }
}

namespace {

// Launches per layer of a bf16 training step (forward, backward, clipping, AdamW) at a small shape
// with tensor-core head sizes (D = 64): the second step of dry runs at 2 and at 4 layers (the
// first makes the weights' bf16 copies), halved.
double launches_per_layer(nn::GPTConfig config) {
    config.vocab_size = 65, config.block_size = 32, config.n_embd = 128, config.n_head = 2;
    const auto launches = [&](int64_t layers) {
        return double(step_ledger(config, layers, /*steps=*/2, nullptr, /*dry_run=*/true).size());
    };
    return (launches(4) - launches(2)) / 2.0;
}

}  // namespace

TEST_CASE("a bf16 step takes at most 50 launches per layer: the default and a Qwen3-style block") {
    if (!cuda_runnable()) return;
#ifndef QK_CUDA_EMULATION
    return;  // a dry run is the emulator's
#endif
    nn::GPTConfig base;  // the default run's block: QK-LayerNorm per head, RoPE, GELU, biases
    base.qk_norm = nn::QKNorm::layernorm, base.pos_emb = nn::PosEmb::rope;
    nn::GPTConfig qwen3 = base;  // GQA, RMSNorm everywhere, SwiGLU, untied head, no biases
    qwen3.n_kv_head = 1, qwen3.qk_norm = nn::QKNorm::rmsnorm, qwen3.norm = nn::NormKind::rmsnorm;
    qwen3.mlp = nn::MLPKind::swiglu, qwen3.bias = false, qwen3.tie_embeddings = false;
    const double default_block = launches_per_layer(base), qwen3_block = launches_per_layer(qwen3);
    MESSAGE("launches per layer: default block ", default_block, ", Qwen3-style ", qwen3_block);
    CHECK(default_block <= 50);  // 270 before the launch work, 84 before this test
    // 53 until the norms and the gated product wrote their outputs (and glu its gradients)
    // rounded for the bias-free Linear layers that read them (ops/rounded_copy.h).
    CHECK(qwen3_block <= 50);
    // 48 each until a per-head norm before RoPE turned its own output (ops/norm.h's rotate: two
    // rope launches forward, two backward) and rows of at most 128 values summed their gains'
    // gradients in the dx pass (here the block norms too, at this width): 40 each. Then the
    // biased Linear layers added their bias in cuBLASLt's epilogue (no bias rows written first),
    // and GELU wrote its output rounded for c_proj: 37 for the default block. Then the attention
    // wrote its output rounded for attn.c_proj: 36 and 39. Then c_fc and GELU became one op whose
    // backward applies GELU's derivative in dY's rounding pass (linear_gelu): 35. Then the norms
    // after each residual add added their dx into the stream's gradient themselves: 33 and 37.
    // Then the norm after each residual add made the add in its forward pass: 31 and 35. A launch
    // more fails here, so that docs/cuda.md's count is changed with it.
    CHECK(default_block <= 31);
    CHECK(qwen3_block <= 35);
}

TEST_CASE("the cost model: a one-block pass over 2.4 M floats costs far more than a full grid's") {
    // 9.4 MB: one block of 256 threads is latency bound (Little's law, a few GB/s); 9,216 blocks
    // (every SM full) stream at the HBM's rate, so the H100 is slower than the H200 there.
    const cost::GpuSpec& h100 = cost::gpu("h100");
    const cost::GpuSpec& h200 = cost::gpu("h200");
    ledger::Entry one_block, full_grid;
    one_block.declared = full_grid.declared = true;
    one_block.bytes = full_grid.bytes = 4.0 * 768 * 3072;
    one_block.block[0] = full_grid.block[0] = 256;
    full_grid.grid[0] = 9216;
    const double slow = cost::estimate_us(one_block, h200),
                 fast = cost::estimate_us(full_grid, h200);
    MESSAGE("one block: ", slow, " us, 9,216 blocks: ", fast, " us");
    CHECK(slow > 50 * fast);
    CHECK(fast < 10);  // 9.4 MB at the ~2.4 TB/s of the backend's kernels: ~4 us, plus the launch
    CHECK(cost::estimate_us(full_grid, h100) > fast);  // less bandwidth
    ledger::Entry undeclared;
    CHECK(cost::estimate_us(undeclared, h200) == doctest::Approx(h200.launch_us));
    ledger::Entry gemm;  // 8192 x 768 x 2304 in bf16 on tensor cores: ~0.06 ms
    gemm.library = gemm.declared = true;
    gemm.tensor_flops = 2.0 * 8192 * 768 * 2304;
    gemm.bytes = 2.0 * (8192 * 768 + 768 * 2304) + 4.0 * 8192 * 2304;
    CHECK(cost::estimate_us(gemm, h200) == doctest::Approx(62.8).epsilon(0.2));
    // The vocabulary head: a dimension of 50,257 leaves cuBLAS's aligned kernels (measured 3.2–5.4×
    // on an H200); the model knows it from the shape in the call's name, 50,304 is aligned.
    ledger::Entry head = gemm, padded = gemm;
    head.tensor_flops = padded.tensor_flops = 2.0 * 16384 * 50257 * 768;
    head.bytes = padded.bytes = 0;
    head.name = "cublas:GemmEx bf16 16384x50257x768";
    padded.name = "cublas:GemmEx bf16 16384x50304x768";
    CHECK(cost::estimate_us(head, h200) > 3 * cost::estimate_us(padded, h200));
    padded.name = "cublas:GemmEx bf16 16384x50304x768 x12";  // a batch count is not a dimension
    CHECK(cost::estimate_us(head, h200) > 3 * cost::estimate_us(padded, h200));
    // Today's calls say which they are: an odd M with aligned rows is fast (the head's dW).
    padded.name = "cublas:GemmEx bf16 50257x768x16384 aligned";
    head.name = "cublas:GemmEx bf16 16384x50304x768 unaligned";
    CHECK(cost::estimate_us(head, h200) > 3 * cost::estimate_us(padded, h200));
    CHECK(test::throws_with([] { cost::gpu("a100"); }, {"unknown GPU 'a100'", "h100", "h200"}));
    const std::string table = cost::table({one_block, full_grid, gemm}, h200);
    CHECK(table.find("| **all** | 3 |") != std::string::npos);
}

TEST_CASE(
    "a dry run leaves no bf16 copy marked current: a real step after it trains as without it") {
    if (!cuda_runnable()) return;
#ifndef QK_CUDA_EMULATION
    return;  // a dry run is the emulator's
#endif
    // The weights' bf16 copies made (or rewritten by AdamW) while launches are only recorded hold
    // nothing: the next real forward must round the weights afresh.
    auto losses = [](bool dry_step_first) {
        nn::GPTConfig config = test::tiny_config();
        config.precision = Precision::bf16;
        nn::GPT model(config, 3);
        model.to(Device::cuda);
        const Tensor x = cyclic_batch(config, 7);
        if (dry_step_first) {
            ledger::open(false, /*dry_run=*/true);
            model.forward(x, x).loss.backward();
            (void)model.forward(x, x);  // a forward after the dry backward, still recorded only
            (void)ledger::close();
        }
        return model.forward(x, x).loss.item();
    };
    CHECK(losses(true) == losses(false));
}

TEST_CASE(
    "Muon orthogonalises the matrices of one shape in one batch: GEMMs per shape, not per matrix") {
    if (!cuda_runnable()) return;
    // Eight 16 × 16 matrices (two parameters of four row blocks) and two 48 × 16 ones.
    Generator gen(3);
    std::vector<Tensor> params;
    for (const Shape& s : {Shape{64, 16}, Shape{64, 16}, Shape{48, 16}, Shape{48, 16}})
        params.push_back(normal(s, 0, 1, kF32, gen).to(Device::cuda).requires_grad_());
    std::vector<nn::MuonMatrix> matrices;
    for (int p = 0; p < 2; ++p)
        for (int b = 0; b < 4; ++b)
            matrices.push_back({params[p], 16 * b, 16, fmt::format("w{}.{}", p, b)});
    matrices.push_back({params[2], 0, -1, "fc1"});
    matrices.push_back({params[3], 0, -1, "fc2"});
    nn::Muon muon(matrices, {.ns_steps = 5});
    for (Tensor& p : params) sum(p * p).backward();
    ledger::open(false);
    muon.step(0.01);
    const auto entries = ledger::close();
    int64_t gemms = 0;
    for (const ledger::Entry& e : entries) gemms += e.library ? 1 : 0;
    CHECK(gemms == 2 * 5 * 3);  // two shapes, five iterations of three products (10 x 15 before)
}
