// bench_prefill: the forward pass over a prompt (a prefill) of a Hugging Face-shaped model with
// random weights, in tokens per second, against raw cblas_sgemm in the same run.
//
//   ./build/bench/bench_prefill [bench/models/qwen3-0.6b] [--tokens 128,512] [--precision bf16]
//   python3 bench/prefill_vs_torch.py        this, and PyTorch + transformers on the same shapes
//
// The model is built from the directory's config.json alone (nn::read_hf_config), initialised
// from a seed: a prefill's speed does not depend on the weights' values. One sequence of T random
// ids runs through GPT::forward without gradient, in eval mode, and returns the logits of every
// position, as transformers' model(input_ids) does. Each line printed is one JSON object
// (engine, tokens, precision, threads, seconds, tokens_per_s, ...), which the comparison script
// reads.
//
// FLOPs of one prefill (2 per multiply-add): 2·T·(P + V·C) for the Linear weights P of the blocks
// and the LM head, plus the attention's q·kᵀ and A·v over the causal half,
// 2·2·L·H·D·T(T+1)/2. The reference: raw cblas_sgemm at the MLP's up-projection (T x C by
// C x I), same threads, its GFLOP/s alternated with the prefill (bench_util.h).
#include <cblas.h>

#include <sstream>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "bench_util.h"
#include "core/factory.h"
#include "core/rng.h"
#include "nn/hf/hf.h"
#include "nn/model/gpt.h"

using namespace qk;

namespace {

std::vector<int64_t> parse_list(const std::string& text) {
    std::vector<int64_t> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
    return out;
}

// Block weights (every Linear of the blocks) and the attention FLOPs of one T-token prefill.
double prefill_flops(const nn::GPTConfig& c, int64_t T) {
    const double C = double(c.n_embd), L = double(c.n_layer);
    const double attn_weights =
        C * double(c.q_width() + 2 * c.kv_width()) + double(c.q_width()) * C;
    const double mlp_weights = (c.mlp == nn::MLPKind::gelu ? 2.0 : 3.0) * C * double(c.mlp_width());
    const double linear = L * (attn_weights + mlp_weights) + double(c.vocab_size) * C;
    const double attention =
        2.0 * 2.0 * L * double(c.n_head * c.head_dim()) * double(T) * double(T + 1) / 2.0;
    return 2.0 * double(T) * linear + attention;
}

}  // namespace

int main(int argc, char** argv) {
    bench::quiet_openblas_threads(argv);
    // ./qk bench runs it from the repository's root without arguments.
    const std::string dir = argc > 1 ? argv[1] : "bench/models/qwen3-0.6b";
    std::vector<int64_t> tokens{128, 512};
    std::string precision = "fp32";
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--tokens")
            tokens = parse_list(argv[i + 1]);
        else if (flag == "--precision")
            precision = argv[i + 1];
        else {
            fmt::print(stderr, "bench_prefill: unknown flag {} (--tokens, --precision)\n", flag);
            return 2;
        }
    }
    nn::GPTConfig config = nn::read_hf_config(dir + "/config.json").config;
    config.precision = nn::parse_precision(precision);
    auto start = std::chrono::steady_clock::now();
    nn::GPT model(config, 1234);
    model.eval();
    const double build_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Generator gen(7);
    for (const int64_t T : tokens) {
        std::vector<int32_t> ids(static_cast<size_t>(T));
        for (int32_t& id : ids)
            id = static_cast<int32_t>(gen.uniform() * double(config.vocab_size));
        const Tensor batch = from_ids(ids, {1, T});
        NoGradGuard no_grad;
        auto prefill = [&] { model.forward(batch); };
        // The reference GEMM: the MLP's up-projection on these T tokens.
        const int64_t C = config.n_embd, I = config.mlp_width();
        std::vector<float> x(size_t(T * C), 0.5f), w(size_t(I * C), 0.25f), y(size_t(T * I));
        auto raw = [&] {
            bench::RawBlasThreads blas_threads;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(I), int(C), 1.0f,
                        x.data(), int(C), w.data(), int(C), 0.0f, y.data(), int(I));
        };
        // Five prefills after a warm-up (RoPE tables, the allocator's free lists, oneDNN's
        // primitives), each next to a median of raw sgemm; their medians.
        prefill();
        std::vector<double> prefill_times, raw_times;
        for (int round = 0; round < 5; ++round) {
            raw_times.push_back(bench::time_median(raw, 0.05, 3));
            const auto t0 = std::chrono::steady_clock::now();
            prefill();
            prefill_times.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(prefill_times.begin(), prefill_times.end());
        std::sort(raw_times.begin(), raw_times.end());
        const double prefill_s = prefill_times[2], raw_s = raw_times[2];
        const double flops = prefill_flops(config, T), raw_flops = 2.0 * double(T * C * I);
        fmt::print(
            "{{\"engine\": \"qknorm\", \"model\": \"{}\", \"tokens\": {}, \"precision\": \"{}\", "
            "\"threads\": {}, \"seconds\": {:.6f}, \"tokens_per_s\": {:.1f}, \"gflops\": {:.1f}, "
            "\"raw_sgemm_gflops\": {:.1f}, \"build_s\": {:.1f}}}\n",
            dir, T, precision, num_threads(), prefill_s, double(T) / prefill_s,
            flops / prefill_s / 1e9, raw_flops / raw_s / 1e9, build_s);
        std::fflush(stdout);
    }
    return 0;
}
