// The image modality (nn/text/modality.h) and the signals split by modality
// (nn/signals/modality_signals.h): the source's entropy against an independent plug-in estimate,
// the mixed stream's layout (markers and sub-vocabularies never mix, the text intact), the mixed
// tokenizer, the split signals against a hand computation on a fixed batch, and training runs
// that log them.
#include <sentencepiece_trainer.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "nn/model/gpt.h"
#include "nn/signals/modality_signals.h"
#include "nn/text/data.h"
#include "nn/text/modality.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using json = nlohmann::json;
using test::throws_with;

namespace {

// H(X | left, up) in bits by counting (a plug-in estimate over `images` images): the source's
// conditional entropy measured from its samples alone, without its probabilities.
double plug_in_entropy(const ImageSource& source, int64_t images, uint64_t seed) {
    const int64_t N = source.size, K = source.codes;
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> counts;  // context -> counts
    Generator gen(seed);
    std::vector<int32_t> image(static_cast<size_t>(N * N));
    for (int64_t i = 0; i < images; ++i) {
        draw_image(source, gen, image.data());
        for (int64_t r = 0; r < N; ++r)
            for (int64_t c = 0; c < N; ++c) {
                const int64_t left = c > 0 ? image[static_cast<size_t>(r * N + c - 1)] : -1;
                const int64_t up = r > 0 ? image[static_cast<size_t>((r - 1) * N + c)] : -1;
                auto& row = counts[{left, up}];
                row.resize(static_cast<size_t>(K));
                ++row[static_cast<size_t>(image[static_cast<size_t>(r * N + c)])];
            }
    }
    double bits = 0, total = 0;
    for (const auto& [context, row] : counts) {
        double n = 0;
        for (int64_t v : row) n += static_cast<double>(v);
        for (int64_t v : row)
            if (v > 0) bits -= static_cast<double>(v) * std::log2(static_cast<double>(v) / n);
        total += n;
    }
    return bits / total;
}

}  // namespace

TEST_CASE("the image source's entropy matches its setting, measured from samples alone") {
    for (const double setting : {0.5, 1.5, 2.5}) {
        CAPTURE(setting);
        const ImageSource source{8, 6, temperature_for_entropy(setting, 8, 6)};
        // Another sample than the one the temperature was fitted on.
        CHECK(std::abs(image_entropy_bits(source, 4000, 99) - setting) < 0.02);
        CHECK(std::abs(plug_in_entropy(source, 20000, 7) - setting) < 0.03);
    }
    // Flatter cells, more bits; near-uniform at a large temperature.
    CHECK(image_entropy_bits({64, 6, 0.3}, 200, 1) < image_entropy_bits({64, 6, 3}, 200, 1));
    CHECK(image_entropy_bits({64, 6, 1e4}, 200, 1) == doctest::Approx(6.0).epsilon(1e-6));
    CHECK(throws_with([] { temperature_for_entropy(7, 64, 6); }, {"out of reach"}));
    CHECK(throws_with([] { temperature_for_entropy(0.01, 64, 6); }, {"out of reach"}));
    CHECK(throws_with([] { image_entropy_bits({1, 6, 1}, 10, 1); }, {"codes must be in"}));
}

// 64x64 images of 4096 codes, all in range, sat minutes before step 1: every bisection probe drew
// 256 images at N² · K evaluations each. Each probe is now bounded; the settings that were cheap
// keep their 256 images, so their temperature and images are those of before.
TEST_CASE("fitting the images' temperature is bounded, and the same where it was cheap") {
    CHECK(probe_images(64, 6) == 256);  // the defaults
    CHECK(probe_images(256, 16) == 256);
    CHECK(probe_images(4096, 64) == 2);  // 2 x 64 x 64 x 4096 = 2^25
    for (const int64_t size : {1, 8, 33, 64})
        for (const int64_t codes : {2, 100, 4096}) {
            const int64_t images = probe_images(codes, size);
            CHECK(images >= 1);
            CHECK((images == 1 || images * size * size * codes <= int64_t{1} << 25));
        }
    // The default source's temperature, as fitted before the bound (and the cut-off of the
    // cells' far codes, whose weights exp gives as exactly 0 anyway).
    CHECK(temperature_for_entropy(3, 64, 6) == doctest::Approx(1.8663098660918203).epsilon(1e-12));
    CHECK(temperature_for_entropy(1, 64, 6) == doctest::Approx(0.45866822786013461).epsilon(1e-12));
}

TEST_CASE("a mixed stream: spans of N^2 codes between markers, the text intact and in order") {
    std::vector<int32_t> text;
    for (int i = 0; i < 50000; ++i) text.push_back(i % 65);
    const ModalityVocab vocab{65, 64};
    for (const double fraction : {0.2, 0.5}) {
        CAPTURE(fraction);
        const ImageSource images =
            ModalityMix{.image_fraction = fraction, .image_entropy = 3, .image_size = 4}
                .image_source();
        const MixedStream stream = mix_modalities(text, vocab, fraction, images, 5);
        std::vector<int32_t> text_again;
        int64_t spans = 0;
        for (size_t i = 0; i < stream.tokens.size(); ++i) {
            const int32_t id = stream.tokens[i];
            REQUIRE(id != vocab.eoi());  // an [EOI] is only ever reached from its [BOI]
            if (id != vocab.boi()) {
                REQUIRE(!vocab.is_image(id));  // a code outside a span
                text_again.push_back(id);
                continue;
            }
            for (int64_t c = 1; c <= 16; ++c) REQUIRE(vocab.is_image(stream.tokens[i + c]));
            REQUIRE(stream.tokens[i + 17] == vocab.eoi());
            i += 17, ++spans;
        }
        CHECK(text_again == text);
        CHECK(spans == stream.summary.images);
        CHECK(std::abs(stream.summary.image_token_share() - fraction) < 0.02);
        CHECK(std::abs(stream.summary.bits_per_code(4) - 3) < 0.1);
        CHECK(mix_modalities(text, vocab, fraction, images, 5).tokens == stream.tokens);  // seeded
        CHECK(mix_modalities(text, vocab, fraction, images, 6).tokens != stream.tokens);
    }
    CHECK(mix_modalities(text, vocab, 0, {}, 5).tokens == text);  // fraction 0: the text alone
    CHECK(throws_with([&] { mix_modalities(text, vocab, 0.95, {}, 1); },
                      {"--image-fraction must be in [0, 0.9]"}));
}

TEST_CASE("the mixed tokenizer: ids after the text's, markers parsed, saved and read back") {
    const Tokenizer text = Tokenizer::char_level("ab\n");
    const Tokenizer mixed = mixed_tokenizer(text, 10);
    CHECK(mixed.vocab_size() == 3 + 10 + 2);
    CHECK(mixed.kind() == "mixed");
    const ModalityVocab vocab = modality_vocab(mixed);
    CHECK(vocab.text_vocab == 3);
    CHECK(vocab.boi() == 13);
    CHECK(mixed.encode("a[BOI]b[EOI]") == std::vector<int32_t>{1, 13, 2, 14});
    CHECK(throws_with([&] { mixed.encode("a[BOI]", false); }, {"'['"}));  // text, not a marker
    CHECK(mixed.decode({1, 13, 3, 12, 14, 2}) == "a[BOI] @[EOI]b");
    const Tokenizer back = Tokenizer::deserialize(mixed.serialize());
    CHECK(back.serialize() == mixed.serialize());
    CHECK(modality_vocab(back).codes == 10);
    CHECK(modality_vocab(text).text_vocab == 0);
    CHECK(throws_with([&] { mixed.decode({15}); }, {"outside the vocabulary"}));
    CHECK(throws_with([] { Tokenizer::deserialize("mixed:x:bytes"); }, {"cannot read"}));
    CHECK(throws_with([] { Tokenizer::deserialize("mixed:1:bytes"); }, {"codes must be in"}));
}

// A text token need not be a whole character, nor keep its space alone: SentencePiece's byte
// fallback spells an emoji in four byte pieces, and its dummy prefix drops the space of a
// sequence's first piece. The mixed tokenizer decodes each run of text ids together.
TEST_CASE("the mixed tokenizer decodes runs of text ids together: bytes and spaces intact") {
    const test::TempDir dir("mixed_sp");
    {
        std::ofstream corpus(dir.path / "corpus.txt");
        for (int i = 0; i < 300; ++i)
            corpus << "to be or not to be, that is the question " << i << "\n";
    }
    REQUIRE(sentencepiece::SentencePieceTrainer::Train(
                "--input=" + (dir.path / "corpus.txt").string() +
                " --model_prefix=" + (dir.path / "sp").string() +
                " --vocab_size=320 --model_type=bpe --byte_fallback=true --minloglevel=2")
                .ok());
    const Tokenizer text = Tokenizer::from_file((dir.path / "sp.model").string());
    const Tokenizer mixed = mixed_tokenizer(text, 10);
    const std::string line = "to be \xF0\x9F\x98\x80 or not[BOI][EOI] that is the question";
    const std::vector<int32_t> ids = mixed.encode(line);
    CHECK(mixed.decode(ids) == text.decode(text.encode("to be \xF0\x9F\x98\x80 or not")) +
                                   "[BOI][EOI]" +
                                   text.decode(text.encode(" that is the question")));
    CHECK(mixed.decode(ids).find("\xF0\x9F\x98\x80 or not[BOI]") != std::string::npos);
}

TEST_CASE("signals by modality equal a hand computation on a fixed batch") {
    // Grouped-query (4 query heads on 2 key heads: heads 0, 1 read key head 0) and a window of
    // 5 keys, so that tiling the key heads or a window one key too wide would show.
    GPTConfig config;
    config.vocab_size = 12, config.block_size = 8, config.n_layer = 1, config.n_head = 4;
    config.n_kv_head = 2, config.sliding_window = 5;
    config.n_embd = 16, config.qk_norm = QKNorm::layernorm, config.bias = false;
    GPT model(config, 3);
    const ModalityVocab vocab{4, 6};  // text 0-3, codes 4-9, markers 10, 11
    for (int32_t t = 0; t < 12; ++t) CHECK(vocab.is_image(t) == (t >= 4 && t <= 9));
    auto is_code = [](int32_t t) { return t >= 4 && t <= 9; };  // the markers are not images
    const Tensor ids = from_ids({0, 10, 4, 5, 6, 11, 1, 2, 3, 10, 7, 8, 9, 4, 11, 0}, {2, 8});
    const Tensor targets = from_ids({10, 4, 5, 6, 11, 1, 2, 3, 10, 7, 8, 9, 4, 11, 0, 1}, {2, 8});
    const GPTOutput out = model.forward(ids, targets, true);
    const ModalitySignals s = modality_signals(model, out, ids, targets, vocab);
    const auto id = ids.to_vector<int32_t>(), target = targets.to_vector<int32_t>();

    // Output side: per-position cross-entropy, ‖z‖ and log Z by the target's modality.
    const auto z = out.logits.to_vector<double>();
    double loss[2] = {}, norm[2] = {}, lse[2] = {}, n[2] = {};
    for (size_t p = 0; p < 16; ++p) {
        const int m = is_code(target[p]) ? 1 : 0;
        double top = -INFINITY, sq = 0, e = 0;
        for (size_t v = 0; v < 12; ++v) top = std::max(top, z[p * 12 + v]);
        for (size_t v = 0; v < 12; ++v)
            sq += z[p * 12 + v] * z[p * 12 + v], e += std::exp(z[p * 12 + v] - top);
        const double log_z = top + std::log(e);
        loss[m] += log_z - z[p * 12 + static_cast<size_t>(target[p])];
        norm[m] += std::sqrt(sq), lse[m] += log_z, n[m] += 1;
    }
    for (int m = 0; m < 2; ++m) {
        CHECK(s.targets[m] == n[m]);
        CHECK(s.loss[m] == doctest::Approx(loss[m]).epsilon(1e-5));
        CHECK(s.logit_norm[m] == doctest::Approx(norm[m]).epsilon(1e-5));
        CHECK(s.log_z[m] == doctest::Approx(lse[m]).epsilon(1e-5));
    }

    // Attention side, from the layer's input: q, k = c_attn(ln_1(x)), LayerNorm per head.
    const auto& attn = model.h[0]->attn;
    const Tensor qkv = attn->c_attn->forward(model.h[0]->ln_1->forward(model.embed(ids)));
    const auto w = qkv.to_vector<double>();  // (2, 8, 32): q (16), then k (8), then v (8)
    const auto gq = attn->q_norm->weight.to_vector<double>();
    const auto gk = attn->k_norm->weight.to_vector<double>();
    // query head h, or key head h / 2 (the group it belongs to)
    auto head = [&](size_t b, size_t t, size_t h, bool key, bool normed) {
        std::vector<double> x(4);
        const size_t at = key ? 16 + (h / 2) * 4 : h * 4;
        for (size_t d = 0; d < 4; ++d) x[d] = w[(b * 8 + t) * 32 + at + d];
        if (!normed) return x;
        double mean = 0, var = 0;
        for (double v : x) mean += v / 4;
        for (double v : x) var += (v - mean) * (v - mean) / 4;
        const auto& g = key ? gk : gq;
        for (size_t d = 0; d < 4; ++d) x[d] = (x[d] - mean) / std::sqrt(var + 1e-5) * g[d];
        return x;
    };
    double qn[2] = {}, qc[2] = {}, top[2][2] = {}, pairs[2][2] = {}, overall = 0;
    for (size_t b = 0; b < 2; ++b)
        for (size_t h = 0; h < 4; ++h)
            for (size_t i = 0; i < 8; ++i) {
                const int a = is_code(id[b * 8 + i]) ? 1 : 0;
                const auto q_raw = head(b, i, h, false, false);
                double sq = 0;
                for (double v : q_raw) sq += v * v;
                qn[a] += std::sqrt(sq), qc[a] += 1;
                const auto q = head(b, i, h, false, true);
                for (size_t j = i >= 4 ? i - 4 : 0; j <= i; ++j) {  // the last 5 keys
                    const int c = is_code(id[b * 8 + j]) ? 1 : 0;
                    const auto k = head(b, j, h, true, true);
                    double dot = 0;
                    for (size_t d = 0; d < 4; ++d) dot += q[d] * k[d];
                    top[a][c] = std::max(top[a][c], std::abs(dot) / 2);  // 1 / sqrt(D), D = 4
                    overall = std::max(overall, std::abs(dot) / 2);
                    pairs[a][c] += 1;
                }
            }
    const ModalitySignals::Layer& layer = s.layers.at(0);
    for (int m = 0; m < 2; ++m) {
        CHECK(layer.q_vectors[m] == qc[m]);
        CHECK(layer.q_norm[m] == doctest::Approx(qn[m]).epsilon(1e-5));
        for (int c = 0; c < 2; ++c) {
            CHECK(layer.max_logit[m][c] == doctest::Approx(top[m][c]).epsilon(1e-5));
            CHECK(layer.pairs[m][c] == pairs[m][c]);
        }
    }
    // The pairs' maxima split the layer's max |s|, which the attention kernel measured.
    CHECK(out.stats[0].max_logit == doctest::Approx(overall).epsilon(1e-5));
    CHECK(layer.q_gain == doctest::Approx(1.0));  // untrained gains
    const json j = modality_json(s);
    CHECK(j["loss"]["image"].get<double>() == doctest::Approx(loss[1] / n[1]).epsilon(1e-5));
    CHECK(j["layers"][0]["max_logit"]["image>text"].get<double>() ==
          doctest::Approx(top[1][0]).epsilon(1e-5));
}

TEST_CASE("the pairs' max |s| is the layer's, at a training shape and every precision") {
    GPTConfig config;
    config.vocab_size = 80, config.block_size = 64, config.n_layer = 2, config.n_head = 4;
    config.n_embd = 64, config.bias = false;
    for (const auto& [variant, precision] : {std::pair{QKNorm::none, Precision::full},
                                             {QKNorm::layernorm, Precision::bf16},
                                             {QKNorm::rmsnorm, Precision::fp16}}) {
        config.qk_norm = variant, config.precision = precision;
        GPT model(config, 5);
        Generator gen(2);
        std::vector<int32_t> id(8 * 64);
        for (auto& v : id) v = static_cast<int32_t>(gen.uniform() * 80);
        const Tensor ids = from_ids(id, {8, 64});
        const GPTOutput out = model.forward(ids, ids, true);
        const ModalitySignals s = modality_signals(model, out, ids, ids, {10, 60});
        for (size_t l = 0; l < 2; ++l) {
            double top = 0;
            for (const auto& row : s.layers[l].max_logit) top = std::max({top, row[0], row[1]});
            CHECK(top == doctest::Approx(out.stats[l].max_logit).epsilon(1e-5));
        }
    }
}

TEST_CASE("a mixed run logs the split signals; the text-only control on the same vocabulary") {
    test::TempDir dir("modality_run");
    TrainConfig mixed = test::tiny_run(dir, "mixed");
    mixed.modalities = {
        .image_fraction = 0.3, .image_entropy = 2, .image_size = 3, .image_codes = 16};
    const TrainResult result = train(mixed);
    CHECK(result.steps_done == mixed.steps);
    const auto lines = test::step_metrics(mixed.run_dir);
    int with_split = 0;
    for (const json& line : lines) {
        if (line.contains("layers")) {
            REQUIRE(line.contains("modality"));
            const json& m = line["modality"];
            CHECK(m["loss"]["image"].is_number());
            CHECK(m["log_z"]["text"].is_number());
            CHECK(m["layers"][0]["max_logit"]["image>text"].is_number());
            CHECK(m["layers"][0]["q_gain"].is_number());  // tiny_run has QK-LayerNorm
            ++with_split;
        }
        if (line.contains("val_loss")) {
            const json& split = line["val_loss_by_modality"];
            CHECK(split["text"].get<double>() > 0);
            CHECK(split["image"].get<double>() > 0);
        }
    }
    CHECK(with_split == 11);  // stats_every 2 over 20 steps, and the last step
    // The checkpoint's tokenizer is the mixed one: the model samples and reads back.
    CHECK(Tokenizer::from_file(mixed.run_dir).vocab_size() ==
          Tokenizer::char_level(read_text_file(mixed.data_path)).vocab_size() + 16 + 2);

    TrainConfig control = test::tiny_run(dir, "control");
    control.modalities.image_codes = 16;
    control.modality_signals = true;
    train(control);
    const json last = test::step_metrics(control.run_dir).back();
    CHECK(last["modality"]["loss"]["image"].is_null());
    CHECK(last["modality"]["layers"][0]["max_logit"]["text>image"].is_null());
    CHECK(last["modality"]["layers"][0]["max_logit"]["text>text"].get<double>() ==
          doctest::Approx(last["layers"][0]["max_logit"].get<double>()));
    CHECK(Tokenizer::from_file(control.run_dir).vocab_size() ==
          Tokenizer::from_file(mixed.run_dir).vocab_size());

    TrainConfig bad = test::tiny_run(dir, "bad");
    bad.modalities.image_fraction = 0.95;
    CHECK(throws_with([&] { train(bad); }, {"--image-fraction must be in [0, 0.9]"}));
    bad.modalities = {.image_fraction = 0.5, .image_entropy = 9};
    CHECK(throws_with([&] { train(bad); }, {"out of reach"}));
}
