// bench_generate: generation through the KV cache, prefill and decode tokens per second, against
// the memory-bandwidth bound measured in the same run.
//
//   ./build/bench/bench_generate [default|DIR ...] [--prompt 128] [--tokens 32]
//                                [--precision fp32,bf16]
//   python3 bench/generate_vs_torch.py     this, and transformers' generate on the same shapes
//
// Models: `default` is the model `qknorm train` trains (the default config); a directory is a
// Hugging Face config.json (bench/models/qwen3-0.6b: Qwen3-0.6B's own), built with random
// weights: speed does not depend on their values. No arguments: both.
//
// One greedy generate() of `tokens` new tokens after a prompt of `prompt` random ids, exactly what
// `qknorm sample` runs: the prompt's prefill, then one cached step per token. Prefill tokens/s is
// prompt / (time to the first token); decode tokens/s is (tokens − 1) / (time from the first
// token to the last). bf16 runs the weights stored as bfloat16 (GPT::store_weights_bf16).
//
// The bound: a decode step reads every weight once (GPT::weight_bytes_per_token: the matrices,
// the LM head, gains and biases; of the embedding one row) and the keys and values cached so
// far, so it cannot beat bandwidth / bytes per step, with the bandwidth of a STREAM-style copy
// on the same threads (bench_util.h), measured just before. A plain read of 256 MB is printed
// next to it (read_gbps, of_read_bound): one core reads more slowly than it copies, so at one
// thread that is the tighter bound. Each line is one JSON object, which the comparison script
// reads.
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "nn/hf/hf.h"
#include "nn/model/gpt.h"
#include "nn/model/sample.h"
#include "nn/train/train_config.h"

using namespace qk;
using clock_type = std::chrono::steady_clock;

namespace {

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(item);
    return out;
}

nn::GPTConfig model_config(const std::string& model) {
    return model == "default" ? nn::TrainConfig{}.model
                              : nn::read_hf_config(model + "/config.json").config;
}

// Bytes of keys and values a decode step reads at `length` cached positions (float32).
double kv_bytes(const nn::GPTConfig& c, int64_t length) {
    double bytes = 0;
    for (int64_t layer = 0; layer < c.n_layer; ++layer) {
        const int64_t seen = c.is_sliding(layer) ? std::min(c.sliding_window, length) : length;
        bytes += 2.0 * double(c.kv_heads() * c.head_dim() * seen) * 4.0;
    }
    return bytes;
}

struct Timing {
    double prefill_s = 0, decode_s = 0;
};

// One greedy generation, the time to the first token and from it to the last.
Timing time_generate(nn::GPT& model, const std::vector<int32_t>& prompt, int64_t tokens) {
    Generator gen(1);
    const auto start = clock_type::now();
    auto first = start, last = start;
    int64_t seen = 0;
    nn::generate(model, prompt, {.max_new_tokens = tokens, .temperature = 0}, gen, [&](int32_t) {
        last = clock_type::now();
        if (seen++ == 0) first = last;
        return true;
    });
    return {std::chrono::duration<double>(first - start).count(),
            std::chrono::duration<double>(last - first).count()};
}

void bench_model(const std::string& name, const std::string& precision, int64_t prompt_length,
                 int64_t tokens) {
    nn::GPTConfig config = model_config(name);
    config.precision = nn::parse_precision(precision);
    const int64_t T = std::min(prompt_length, config.block_size - tokens);
    nn::GPT model(config, 1234);
    if (config.precision == Precision::bf16) model.store_weights_bf16();
    Generator gen(7);
    std::vector<int32_t> prompt(static_cast<size_t>(T));
    for (int32_t& id : prompt) id = static_cast<int32_t>(gen.uniform() * double(config.vocab_size));
    time_generate(model, prompt, 4);  // warm-up: RoPE tables, the allocator, oneDNN's primitives
    const double copy_gbps = bench::stream_copy_gbps(), read_gbps = bench::stream_read_gbps();
    std::vector<double> prefills, decodes;
    for (int round = 0; round < 3; ++round) {
        const Timing t = time_generate(model, prompt, tokens);
        prefills.push_back(t.prefill_s), decodes.push_back(t.decode_s);
    }
    std::sort(prefills.begin(), prefills.end()), std::sort(decodes.begin(), decodes.end());
    const double decode_tps = double(tokens - 1) / decodes[1];
    // The average step: T + tokens/2 positions cached, one embedding row read.
    const double bytes = double(model.weight_bytes_per_token()) + kv_bytes(config, T + tokens / 2) +
                         double(config.n_embd) * 4.0;
    const double bound_tps = copy_gbps * 1e9 / bytes, read_bound_tps = read_gbps * 1e9 / bytes;
    fmt::print(
        "{{\"engine\": \"qknorm\", \"model\": \"{}\", \"precision\": \"{}\", \"threads\": {}, "
        "\"prompt\": {}, \"tokens\": {}, \"prefill_tokens_per_s\": {:.1f}, "
        "\"decode_tokens_per_s\": {:.2f}, \"bytes_per_token\": {:.0f}, \"copy_gbps\": {:.2f}, "
        "\"bound_tokens_per_s\": {:.2f}, \"of_bound\": {:.3f}, \"read_gbps\": {:.2f}, "
        "\"of_read_bound\": {:.3f}, \"n_layer\": {}, \"n_embd\": {}, "
        "\"n_head\": {}, \"block_size\": {}, \"vocab_size\": {}}}\n",
        name, precision, num_threads(), T, tokens, double(T) / prefills[1], decode_tps, bytes,
        copy_gbps, bound_tps, decode_tps / bound_tps, read_gbps, decode_tps / read_bound_tps,
        config.n_layer, config.n_embd, config.n_head, config.block_size, config.vocab_size);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    bench::quiet_openblas_threads(argv);
    std::vector<std::string> models;
    std::vector<std::string> precisions{"fp32", "bf16"};
    int64_t prompt = 128, tokens = 32;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg.rfind("--", 0) != 0) {
            models.push_back(arg);
            continue;
        }
        if (i + 1 >= argc) {
            fmt::print(stderr, "bench_generate: {} needs a value\n", arg);
            return 2;
        }
        const std::string value = argv[++i];
        if (arg == "--prompt")
            prompt = std::stoll(value);
        else if (arg == "--tokens")
            tokens = std::stoll(value);
        else if (arg == "--precision")
            precisions = split(value);
        else {
            fmt::print(stderr,
                       "bench_generate: unknown flag {} (--prompt, --tokens, --precision)\n", arg);
            return 2;
        }
    }
    // ./qk bench runs it from the repository's root without arguments.
    if (models.empty()) models = {"default", "bench/models/qwen3-0.6b"};
    for (const std::string& model : models)
        for (const std::string& precision : precisions)
            bench_model(model, precision, prompt, tokens);
    return 0;
}
