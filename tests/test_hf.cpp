// Hugging Face models in and out (nn/hf/hf.h) against transformers itself: tests/data/hf holds tiny
// random GPT-2, Qwen3, OLMo 2 and Gemma 3 models that transformers built and saved, with the
// logits and per-layer hidden states it computed for fixed ids in float32 and float64
// (tools/make_hf_fixtures.py). Each loads here and matches them, from the 5.x config.json and
// from the 4.x form of the same config; export writes back what transformers wrote; and every
// hostile directory is a clean error naming the file and the key or tensor. Also the float16
// reader those fixtures need.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/float16.h"
#include "core/safetensors.h"
#include "cuda_parity.h"
#include "helpers.h"
#include "hf_fixtures.h"
#include "nn/hf/hf.h"
#include "nn/lab/inspect.h"
#include "nn/model/sample.h"
#include "nn/train/checkpoint.h"
#include "nn/train/trainer.h"
#include "run_program.h"

using namespace qk;
using namespace qk::nn;
using qk::test::fixture;
using qk::test::kFamilies;
using qk::test::relative_error;
using qk::test::ScratchDir;
using qk::test::throws_with;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The residual stream after the embedding and after each block, and the final norm's output:
// what transformers returns as hidden_states (its last entry has the final norm applied).
std::vector<Tensor> hidden_states(GPT& model, const Tensor& ids) {
    NoGradGuard no_grad;
    Tensor x = model.embed(ids);
    std::vector<Tensor> out{x};
    for (auto& block : model.h) out.push_back(x = block->forward(x, nullptr, nullptr));
    out.back() = model.ln_f->forward(x);
    return out;
}

}  // namespace

TEST_CASE("float16 widens to float32 exactly: every one of the 65,536 values") {
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint32_t e = (h >> 10) & 31, f = h & 1023;
        const double sign = h & 0x8000 ? -1.0 : 1.0;
        const double want = e == 31  ? (f ? NAN : sign * INFINITY)
                            : e == 0 ? sign * std::ldexp(f, -24)
                                     : sign * std::ldexp(1024 + f, static_cast<int>(e) - 25);
        const float got = float16_to_float(static_cast<uint16_t>(h));
        if (std::isnan(want)) {
            CHECK(std::isnan(got));
        } else {
            CHECK(static_cast<double>(got) == want);
            CHECK(std::signbit(got) == std::signbit(want));  // −0 stays −0
        }
    }
}

TEST_CASE("every family matches transformers' logits and hidden states, float32 and float64") {
    for (const std::string family : kFamilies) {
        CAPTURE(family);
        const SafetensorsFile ref = load_safetensors(fixture(family) + "/reference.safetensors");
        const Tensor ids = ref.get("ids");
        for (const DType dtype : {kF32, kF64}) {
            CAPTURE(dtype);
            const bool f64 = dtype == kF64;
            const double tolerance = f64 ? 1e-10 : 1e-5;
            auto model = load_hf_model(fixture(family), dtype);
            const Tensor logits = model->forward(ids).logits;
            CHECK(relative_error(logits, ref.get(f64 ? "logits_f64" : "logits_f32")) <= tolerance);
            const Tensor hidden = ref.get(f64 ? "hidden_f64" : "hidden_f32");
            const std::vector<Tensor> ours = hidden_states(*model, ids);
            REQUIRE(static_cast<int64_t>(ours.size()) == hidden.size(0));
            for (size_t layer = 0; layer < ours.size(); ++layer) {
                CAPTURE(layer);
                CHECK(relative_error(ours[layer], hidden.select(0, layer)) <= tolerance);
            }
        }
    }
}

TEST_CASE("every family matches transformers' logits on the cuda backend too") {
    // The emulator in CI; a GPU where there is one. float32 only: the fused attention's cuda
    // kernel takes head dims up to 64 in float64, and the point is the cuda code path.
    if (!test::cuda_runnable()) return;
    for (const std::string family : kFamilies) {
        CAPTURE(family);
        const SafetensorsFile ref = load_safetensors(fixture(family) + "/reference.safetensors");
        auto model = load_hf_model(fixture(family));
        model->to(Device::cuda);
        const Tensor logits = model->forward(ref.get("ids").to(Device::cuda)).logits;
        CHECK(relative_error(logits.to(Device::cpu), ref.get("logits_f32")) <= 1e-5);
    }
}

TEST_CASE("a config.json in transformers 4.x form gives the same model as the 5.x form") {
    for (const std::string family : {"qwen3", "olmo2", "gemma3"}) {
        CAPTURE(family);
        ScratchDir dir(family);
        fs::copy_file(dir.path / "config.v4.json", dir.path / "config.json",
                      fs::copy_options::overwrite_existing);
        const GPTConfig v4 = read_hf_config(dir.str() + "/config.json").config;
        const GPTConfig v5 = read_hf_config(fixture(family) + "/config.json").config;
        CHECK(v4.to_strings() == v5.to_strings());
    }
    // Gemma 3's pattern: every 2nd layer global, 1e4 locally, 1e6 globally.
    const GPTConfig gemma = read_hf_config(fixture("gemma3") + "/config.v4.json").config;
    CHECK(gemma.is_sliding(0));
    CHECK(!gemma.is_sliding(1));
    CHECK(gemma.is_sliding(2));
    CHECK(gemma.rope_local_theta == 1e4);
    CHECK(gemma.rope_theta == 1e6);
}

TEST_CASE("export writes the config transformers wrote, and tensors that load back bit for bit") {
    for (const std::string family : kFamilies) {
        CAPTURE(family);
        auto model = load_hf_model(fixture(family));
        const test::TempDir dir("hf_export");
        const fs::path out = dir.path / family;
        save_hf_model(*model, out.string());
        // Every key written has the value transformers wrote (it writes more: token ids, dtype).
        std::ifstream theirs_file(fixture(family) + "/config.json"), ours_file(out / "config.json");
        const json theirs = json::parse(theirs_file), ours = json::parse(ours_file);
        for (const auto& [key, value] : ours.items()) {
            CAPTURE(key);
            if (key == "dtype") continue;  // ours is float32 whatever the source was stored in
            REQUIRE(theirs.contains(key));
            if (value.is_number_float())
                CHECK(value.get<double>() == doctest::Approx(theirs[key].get<double>()));
            else
                CHECK(value == theirs[key]);
        }
        auto back = load_hf_model(out.string());
        const auto a = model->named_parameters(), b = back->named_parameters();
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
            CAPTURE(a[i].first);
            CHECK(a[i].second.to_vector<double>() == b[i].second.to_vector<double>());
        }
    }
}

TEST_CASE("export never replaces a user's files silently, nor leaves a stale index or shard") {
    auto model = load_hf_model(fixture("qwen3"));
    const test::TempDir dir("hf_export_target");
    const fs::path own = dir.path / "own", sharded = dir.path / "sharded", run = dir.path / "run";
    auto write = [](const fs::path& path, const std::string& text) {
        fs::create_directories(path.parent_path());
        std::ofstream(path) << text;
    };
    // A directory holding a user's own files: refused, untouched; with overwrite, only the
    // model's files are replaced.
    write(own / "model.safetensors", "mine");
    write(own / "notes.txt", "keep me");
    CHECK(throws_with([&] { save_hf_model(*model, own.string()); },
                      {"export --hf", "is not empty", "model.safetensors, notes.txt", "--force"}));
    CHECK(test::read_file((own / "model.safetensors").string()) == "mine");
    save_hf_model(*model, own.string(), /*overwrite=*/true);
    CHECK(test::read_file((own / "notes.txt").string()) == "keep me");
    CHECK(load_hf_model(own.string())->named_parameters().size() ==
          model->named_parameters().size());
    // A sharded model directory: the index and the shards go, or the old weights would load.
    write(sharded / "model.safetensors.index.json", "{}");
    write(sharded / "model-00001-of-00002.safetensors", "old");
    write(sharded / "model-00002-of-00002.safetensors", "old");
    write(sharded / "config.json", "{}");
    CHECK(throws_with([&] { save_hf_model(*model, sharded.string()); }, {"is not empty"}));
    save_hf_model(*model, sharded.string(), true);
    std::vector<std::string> left;
    for (const auto& entry : fs::directory_iterator(sharded))
        left.push_back(entry.path().filename().string());
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<std::string>{"config.json", "model.safetensors"});
    // A qknorm run directory: refused even with overwrite, nothing touched.
    write(run / "metrics.jsonl", "{}\n");
    write(run / "config.json", "{\"run\": 1}");
    CHECK(throws_with([&] { save_hf_model(*model, run.string(), true); },
                      {"qknorm run directory", "never replaced"}));
    CHECK(test::read_file((run / "config.json").string()) == "{\"run\": 1}");
}

TEST_CASE("export refuses a model no transformers class computes, naming what is missing") {
    GPTConfig c;  // the lab's default: GPT-2's block with QK-LayerNorm
    c.vocab_size = 11, c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
    c.qk_norm = QKNorm::layernorm;
    GPT model(c, 1);
    CHECK(throws_with([&] { save_hf_model(model, "/tmp/qk_never_written"); },
                      {"export --hf", "GPT2LMHeadModel", "qk_norm none"}));
    CHECK(!fs::exists("/tmp/qk_never_written"));
}

TEST_CASE("hostile weights: wrong shape or dtype, missing, extra, duplicated, outside the dir") {
    {  // a tensor of the wrong shape, then of integer dtype
        ScratchDir dir("olmo2");
        SafetensorsFile f = load_safetensors(dir.str() + "/model.safetensors");
        auto rewrite = [&](const Tensor& replacement) {
            auto tensors = f.tensors;
            for (auto& [name, t] : tensors)
                if (name == "model.layers.1.self_attn.k_norm.weight") t = replacement;
            save_safetensors(dir.str() + "/model.safetensors", tensors);
        };
        rewrite(ones({8}));
        CHECK(throws_with(
            [&] { load_hf_model(dir.str()); },
            {"model.safetensors", "model.layers.1.self_attn.k_norm.weight", "[8]", "[16]"}));
        rewrite(ones({16}).to(kI32));
        CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"k_norm.weight", "int32"}));
        auto tensors = f.tensors;  // one missing
        tensors.erase(tensors.begin());
        save_safetensors(dir.str() + "/model.safetensors", tensors);
        CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"missing"}));
        tensors = f.tensors;  // one extra
        tensors.emplace_back("model.layers.9.mlp.up_proj.weight", ones({2, 2}));
        save_safetensors(dir.str() + "/model.safetensors", tensors);
        CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"model.layers.9.mlp.up_proj.weight",
                                                              "not part of", "Olmo2ForCausalLM"}));
    }
    {  // shards: an index entry outside the directory, a tensor in two shards, an unlisted one
        ScratchDir dir("qwen3");
        const json index = dir.read("model.safetensors.index.json");
        json bad = index;
        bad["weight_map"]["model.norm.weight"] = "../model-00001-of-00003.safetensors";
        dir.write("model.safetensors.index.json", bad);
        CHECK(throws_with([&] { load_hf_model(dir.str()); },
                          {"index.json", "model.norm.weight", "outside the model directory"}));
        bad = index;
        bad["weight_map"]["model.norm.weight"] = "/etc/passwd";
        dir.write("model.safetensors.index.json", bad);
        CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"outside the model directory"}));
        std::ofstream(dir.str() + "/model.safetensors.index.json", std::ios::binary)
            << "{\"weight_map\": " + std::string(50000, '[') + std::string(50000, ']') + "}";
        CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"index.json", "nested 50001 deep"}));
        // "./name" and "sub/../name" name a file inside the directory: transformers loads them.
        json dotted = index;
        for (auto& [name, file] : dotted["weight_map"].items())
            file = (name == "model.norm.weight" ? "sub/../" : "./") + file.get<std::string>();
        dir.write("model.safetensors.index.json", dotted);
        const Tensor loaded_norm =
            load_hf_model(dir.str())->named_parameters().back().second.detach();
        dir.write("model.safetensors.index.json", index);
        CHECK(loaded_norm.to_vector<double>() ==
              load_hf_model(dir.str())->named_parameters().back().second.to_vector<double>());
        const std::string first = dir.str() + "/model-00001-of-00003.safetensors";
        const std::string last = dir.str() + "/model-00003-of-00003.safetensors";
        SafetensorsFile a = load_safetensors(first), c = load_safetensors(last);
        auto with_copy = c.tensors;
        with_copy.push_back(a.tensors.front());
        save_safetensors(last, with_copy);
        CHECK(throws_with([&] { load_hf_model(dir.str()); }, {a.tensors.front().first, "also in"}));
        with_copy = c.tensors;
        with_copy.emplace_back("model.extra.weight", ones({2}));
        save_safetensors(last, with_copy);
        CHECK(throws_with([&] { load_hf_model(dir.str()); },
                          {"index", "model.extra.weight", "does not list it"}));
    }
    CHECK(throws_with([&] { load_hf_model("/nonexistent_qk_dir"); }, {"config.json"}));
}

TEST_CASE(
    "a directory with model.safetensors and an index loads the single file, as transformers") {
    ScratchDir dir("qwen3");
    const auto sharded = load_hf_model(dir.str());
    // The single file holds other weights than the shards (every one scaled by 2): the loaded
    // model must be the single file's.
    std::vector<std::pair<std::string, Tensor>> doubled;
    for (const char* shard :
         {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
          "model-00003-of-00003.safetensors"})
        for (auto& [name, t] : load_safetensors(dir.str() + "/" + shard).tensors)
            doubled.emplace_back(name, (t.to(kF32) * 2.0).to(t.dtype()));
    save_safetensors(dir.str() + "/model.safetensors", doubled);
    const auto single = load_hf_model(dir.str());
    const auto want = sharded->named_parameters(), got = single->named_parameters();
    REQUIRE(want.size() == got.size());
    for (size_t i = 0; i < want.size(); ++i) {
        const auto w = want[i].second.to_vector<double>(), g = got[i].second.to_vector<double>();
        for (size_t j = 0; j < w.size(); ++j) REQUIRE(g[j] == 2 * w[j]);
    }
}

TEST_CASE("a config.json far larger than its weights is refused before the model is built") {
    ScratchDir dir("gemma3");
    json j = dir.read("config.json");
    j["vocab_size"] = 1 << 24;  // 2^24 x 32 weights: 2 GB in float32, beside a 40 kB checkpoint
    dir.write("config.json", j);
    CHECK(throws_with([&] { load_hf_model(dir.str()); },
                      {"config.json describes a model of at least", "vocab_size 16777216",
                       "does not belong to these weights"}));
    j = dir.read("config.json");
    j["vocab_size"] = 300, j["intermediate_size"] = 1 << 18;
    dir.write("config.json", j);
    CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"MLP width 262144"}));
}

// An exported model carries the tokenizer it trained with (AutoTokenizer gave an empty one: "ROMEO:
// hi" -> []). Each file is read back here with the ids of the tokenizer it came from; that
// transformers reads the same ids was checked with transformers 5.x: byte and BPE files identical,
// SentencePiece identical but for runs of spaces a collapsing model folds (docs/models.md).
TEST_CASE("export writes the tokenizer the model trained with, which reads back with its ids") {
    const char* fixtures = std::getenv("TOKENIZER_FIXTURES");
    REQUIRE(fixtures);
    const std::string text = "ROMEO: hi, 1234 \xC3\xA9 \xF0\x9F\x98\x80 <mask>";
    const test::TempDir dir("hf_tokenizer");
    struct Case {
        Tokenizer tokenizer;
        std::vector<std::string> files;
    };
    const std::vector<Case> cases = {
        {Tokenizer::byte_level(), {"tokenizer.json", "tokenizer_config.json"}},
        {Tokenizer::from_file(std::string(fixtures) + "/gpt2_style.json"),
         {"tokenizer.json", "tokenizer_config.json"}},
        {Tokenizer::from_file(std::string(fixtures) + "/sp_bpe.model"),
         {"tokenizer.model", "tokenizer_config.json"}}};
    int n = 0;
    for (const Case& c : cases) {
        CAPTURE(c.tokenizer.kind());
        const std::string out = (dir.path / std::to_string(n++)).string();
        std::filesystem::create_directories(out);
        std::string why;
        CHECK((save_hf_tokenizer(c.tokenizer, HFFamily::qwen3, out, &why) == c.files));
        const Tokenizer back = Tokenizer::from_file(tokenizer_file_in(out));
        CHECK((back.encode(text) == c.tokenizer.encode(text)));
        CHECK(back.decode(back.encode(text)) == text);
        const json config = json::parse(test::read_file(out + "/tokenizer_config.json"));
        if (c.tokenizer.kind() == "sentencepiece") {  // no dummy prefix in this model
            CHECK(config["tokenizer_class"] == "LlamaTokenizer");
            CHECK(config["add_prefix_space"] == false);
            CHECK(config["add_bos_token"] == false);
        } else {
            CHECK(config["tokenizer_class"] == "PreTrainedTokenizerFast");
        }
    }
    // Characters have no Hugging Face form: nothing written, and the reason.
    std::string why;
    CHECK(save_hf_tokenizer(Tokenizer::char_level("ab"), HFFamily::qwen3, dir.path.string(), &why)
              .empty());
    CHECK(why.find("--tokenizer byte") != std::string::npos);
}

// The first thing a transformers or llama.cpp user does with a model directory: sample from it.
TEST_CASE(
    "qknorm sample --model DIR generates from a Hugging Face directory, greedy = generate()") {
    const std::string prompt = "To be";
    for (const std::string& family : {std::string("qwen3"), std::string("gemma3")}) {
        CAPTURE(family);
        // In process: the model, the text as bytes (the fixtures ship no tokenizer), greedy.
        auto model = load_hf_model(fixture(family));
        const Tokenizer bytes = Tokenizer::byte_level();
        SampleOptions options;
        options.max_new_tokens = 12, options.temperature = 0, options.vocab = bytes.vocab_size();
        std::vector<Generator> gens{Generator(0)};
        const auto texts = generate(*model, {bytes.encode(prompt)}, options, gens);
        const test::Outcome out =
            test::run_program({test::qknorm_program(), "sample", "--model", fixture(family),
                               "--prompt", prompt, "--tokens", "12", "--temperature", "0"});
        CHECK(out.exit_code == 0);
        CHECK((out.output == bytes.decode(texts[0]) + "\n"));
        // bf16 inference from the same directory, and a second source refused by name.
        const test::Outcome bf16 =
            test::run_program({test::qknorm_program(), "sample", "--model", fixture(family),
                               "--prompt", prompt, "--tokens", "4", "--precision", "bf16"});
        CHECK(bf16.exit_code == 0);
        CHECK(bf16.output.rfind(prompt, 0) == 0);
    }
    const test::Outcome both = test::run_program(
        {test::qknorm_program(), "sample", "--model", fixture("qwen3"), "--ckpt", "x.safetensors"});
    CHECK(both.exit_code == 1);
    CHECK(both.output.find("one of them") != std::string::npos);
}

TEST_CASE("qknorm export --hf writes a trained Qwen3-shaped model; the lab's default is refused") {
    const test::TempDir dir("hf_cli");
    const fs::path& root = dir.path;
    {
        std::ofstream corpus(root / "corpus.txt");
        for (int i = 0; i < 200; ++i) corpus << "to be or not to be, that is the question. ";
    }
    const std::string corpus = (root / "corpus.txt").string();
    const std::string run = (root / "qwen").string(), hf = (root / "qwen_hf").string();
    test::require_ok(test::run_program(
        test::tiny_train_args(corpus, run,
                              {"--steps", "2", "--batch-size", "2", "--norm", "rmsnorm",
                               "--qk-norm", "rmsnorm", "--pos-emb", "rope", "--mlp", "swiglu",
                               "--bias", "false", "--n-kv-head", "1", "--norm-eps", "1e-6"})));
    const test::Outcome out =
        test::run_program({test::qknorm_program(), "export", "--run-dir", run, "--hf", hf});
    test::require_ok(out);
    CHECK(out.output.find("Qwen3ForCausalLM") != std::string::npos);
    const LoadedModel trained = load_model(nn::latest_model_checkpoint(run));
    auto exported = load_hf_model(hf);
    CHECK(exported->config().kv_heads() == 1);
    const auto a = trained.model->named_parameters(), b = exported->named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(a[i].first);
        CHECK(a[i].first == b[i].first);
        CHECK(a[i].second.to_vector<double>() == b[i].second.to_vector<double>());
    }
    const std::string plain = (root / "plain").string();
    test::require_ok(test::run_program(test::tiny_train_args(corpus, plain, {"--steps", "1"})));
    const test::Outcome refused = test::run_program(
        {test::qknorm_program(), "export", "--run-dir", plain, "--hf", (root / "x").string()});
    CHECK(refused.exit_code != 0);
    CHECK(refused.output.find("qk_norm none") != std::string::npos);
    CHECK(!fs::exists(root / "x"));
}

TEST_CASE("inspect: the loss and per-head signals of a model over a text, window by window") {
    auto model = load_hf_model(fixture("qwen3"));
    std::vector<int32_t> ids;
    for (int i = 0; i < 23; ++i) ids.push_back((i * 37 + 11) % 300);
    // One window: exactly the forward's cross-entropy and signals.
    const InspectReport one = inspect_model(*model, ids, 64);
    std::vector<int32_t> x(ids.begin(), ids.end() - 1), y(ids.begin() + 1, ids.end());
    const GPTOutput out = model->forward(from_ids(x, {1, 22}), from_ids(y, {1, 22}), true);
    CHECK(one.windows == 1);
    CHECK(one.tokens == 22);
    CHECK(one.loss == doctest::Approx(out.cross_entropy.item()).epsilon(1e-6));
    for (int64_t layer = 0; layer < 3; ++layer)
        for (int64_t h = 0; h < 4; ++h) {
            const HeadSignals& s = one.heads[layer][h];
            const AttentionStats& want = out.stats[layer];
            CHECK(s.max_logit == doctest::Approx(want.head_max_logit[h]).epsilon(1e-6));
            CHECK(s.entropy == doctest::Approx(want.head_entropy[h]).epsilon(1e-6));
            CHECK(s.k_norm == doctest::Approx(want.head_k_norm[h / 2]).epsilon(1e-6));
            CHECK(s.q_norm_after == doctest::Approx(want.head_q_norm_after[h]).epsilon(1e-6));
        }
    // Windows of 10, 10 and 2 predictions: the loss is their token-weighted mean.
    const InspectReport three = inspect_model(*model, ids, 10);
    CHECK(three.windows == 3);
    double sum = 0;
    for (int64_t begin : {0, 10, 20}) {
        const int64_t T = begin == 20 ? 2 : 10;
        std::vector<int32_t> wx(ids.begin() + begin, ids.begin() + begin + T);
        std::vector<int32_t> wy(ids.begin() + begin + 1, ids.begin() + begin + T + 1);
        sum += model->forward(from_ids(wx, {1, T}), from_ids(wy, {1, T})).cross_entropy.item() * T;
    }
    CHECK(three.loss == doctest::Approx(sum / 22).epsilon(1e-6));
    CHECK(three.gain_range.size() == 3);
    CHECK(inspect_table(three).find("mean next-token loss") != std::string::npos);
    CHECK(throws_with([&] { inspect_model(*model, {5}, 8); }, {"inspect", "at least 2"}));
    CHECK(throws_with([&] { inspect_model(*model, ids, 0); }, {"inspect", "window", "0"}));
    // A NaN in layer 1's q projection (the first rows of c_attn): refused by name, not a table
    // of "nan" and zeros with exit status 0.
    for (auto& [name, p] : model->named_parameters())
        if (name == "transformer.h.1.attn.c_attn.weight") p.data<float>()[3] = NAN;
    CHECK(throws_with([&] { inspect_model(*model, ids, 64); },
                      {"inspect", "not finite", "the mean loss is nan", "layer 1 head"}));
}

TEST_CASE("qknorm inspect prints the table and writes the plot, for a Hugging Face directory") {
    const test::TempDir dir("inspect");
    const fs::path& root = dir.path;
    std::ofstream(root / "text.txt") << "It is a truth universally acknowledged, that a single "
                                        "man in possession of a good fortune must be in want.";
    const test::Outcome out = test::run_program(
        {test::qknorm_program(), "inspect", "--model", fixture("gemma3"), "--text",
         (root / "text.txt").string(), "--window", "16", "--out", (root / "p.svg").string()});
    test::require_ok(out);
    CHECK(out.output.find("mean next-token loss") != std::string::npos);
    CHECK(out.output.find("max|logit|") != std::string::npos);
    const std::string head = test::read_file(dir / "p.svg");
    CHECK(head.find("<svg") != std::string::npos);
    CHECK(head.find("attention entropy") != std::string::npos);
    const test::Outcome both =
        test::run_program({test::qknorm_program(), "inspect", "--model", fixture("gemma3"),
                           "--ckpt", "x", "--text", (root / "text.txt").string()});
    CHECK(both.exit_code != 0);
    CHECK(both.output.find("one of them") != std::string::npos);
    CHECK(both.output.find("--run-dir") != std::string::npos);
    const test::Outcome negative =  // was the default window, silently
        test::run_program({test::qknorm_program(), "inspect", "--model", fixture("gemma3"),
                           "--text", (root / "text.txt").string(), "--window", "-5"});
    CHECK(negative.exit_code == 2);
    CHECK(negative.output.find("--window") != std::string::npos);
}
