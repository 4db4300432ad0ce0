// Checkpoints: safetensors written bit-identically and in the standard layout (checked by parsing
// the bytes here), hostile files rejected with a qk::Error that names the problem, atomic writes,
// model / training-state checkpoints that restore exactly. The config's string form that they
// carry in __metadata__ is tests/test_config.cpp's.
#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "error_in_child.h"
#include "helpers.h"
#include "nn/train/checkpoint.h"
#include "nn/train/run_optimizer.h"

using namespace qk;
using namespace qk::nn;
using qk::test::max_abs_diff;
using qk::test::throws_with;
namespace fs = std::filesystem;
using qk::test::error_in_child;
using qk::test::read_file;
using qk::test::TempDir;
using json = nlohmann::json;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file from its parts: 8-byte little-endian header length, header, data.
std::string make_file(const std::string& header, const std::string& data,
                      uint64_t header_len = UINT64_MAX) {
    if (header_len == UINT64_MAX) header_len = header.size();
    std::string out;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
    return out + header + data;
}

// The tensors of the round-trip test: every dtype, rank 0, empty, and a transposed view.
std::vector<std::pair<std::string, Tensor>> sample_tensors() {
    Generator gen(3);
    Tensor f32 = randn({3, 5}, kF32, gen), f64 = randn({2, 3, 4}, kF64, gen);
    {
        auto v = f32.to_vector<float>();
        v[0] = -0.0f, v[1] = 1e-40f, v[2] = std::numeric_limits<float>::max();  // sign, denormal
        std::memcpy(f32.raw_data(), v.data(), v.size() * 4);
    }
    return {{"weights.f32", f32},
            {"weights.f64", f64},
            {"ids", from_ids({-7, 0, 2147483647, -2147483647 - 1}, {2, 2})},
            {"scalar", scalar_tensor(2.5, kF64)},
            {"empty", zeros({0, 4}, kF32)},
            {"transposed", f64.transpose(0, 2)}};
}

bool bit_identical(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
    Tensor ca = a.contiguous(), cb = b.contiguous();
    return std::memcmp(ca.raw_data(), cb.raw_data(), ca.numel() * dtype_size(ca.dtype())) == 0;
}

std::string parse_error(const std::string& bytes) {
    return qk::test::error_message([&] { parse_safetensors(bytes, "hostile.safetensors"); });
}

// One F32 tensor "a" of shape [1] (4 bytes) in a header, with the given overrides.
std::string tensor_entry(const std::string& dtype, const std::string& shape,
                         const std::string& offsets) {
    return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets +
           "}";
}

}  // namespace

// ---- safetensors ---------------------------------------------------------------------------

TEST_CASE("safetensors round trip is bit-identical for f32, f64, i32, rank 0, empty, views") {
    TempDir dir("ckpt_roundtrip");
    const auto tensors = sample_tensors();
    const std::map<std::string, std::string> metadata{{"format", "pt"},
                                                      {"note", "quote \" and\nnewline, é"}};
    save_safetensors(dir / "t.safetensors", tensors, metadata);
    SafetensorsFile back = load_safetensors(dir / "t.safetensors");
    REQUIRE(back.tensors.size() == tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
        CAPTURE(tensors[i].first);
        CHECK(back.tensors[i].first == tensors[i].first);  // in the order they were written
        CHECK(bit_identical(back.tensors[i].second, tensors[i].second));
        CHECK(bit_identical(back.get(tensors[i].first), tensors[i].second));
    }
    CHECK(back.metadata == metadata);
    CHECK(back.contains("scalar"));
    CHECK(!back.contains("nothing"));
    CHECK(throws_with([&] { back.get("nothing"); }, {"'nothing'", "missing"}));
    // No metadata at all is fine too.
    save_safetensors(dir / "u.safetensors", {{"x", ones({2})}});
    CHECK(load_safetensors(dir / "u.safetensors").metadata.empty());
}

TEST_CASE("the file is standard safetensors: LE header length, JSON header, data_offsets") {
    TempDir dir("ckpt_layout");
    const auto tensors = sample_tensors();
    save_safetensors(dir / "t.safetensors", tensors, {{"k", "v"}});
    const std::string bytes = read_file(dir / "t.safetensors");
    REQUIRE(bytes.size() >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    REQUIRE(8 + n <= bytes.size());
    CHECK(n % 8 == 0);  // padded with spaces so the data starts 8-byte aligned
    const json header = json::parse(bytes.substr(8, n));
    REQUIRE(header.is_object());
    CHECK(header["__metadata__"] == json{{"k", "v"}});
    const std::string data = bytes.substr(8 + n);
    size_t total = 0;
    for (const auto& [name, t] : tensors) {
        CAPTURE(name);
        const json& e = header.at(name);
        CHECK(e["dtype"] == (t.dtype() == kF32 ? "F32" : t.dtype() == kF64 ? "F64" : "I32"));
        CHECK(e["shape"].get<Shape>() == t.shape());
        const auto begin = e["data_offsets"][0].get<size_t>(),
                   end = e["data_offsets"][1].get<size_t>();
        Tensor c = t.contiguous();
        const size_t nbytes = c.numel() * dtype_size(c.dtype());
        REQUIRE(end - begin == nbytes);
        REQUIRE(end <= data.size());
        CHECK(std::memcmp(data.data() + begin, c.raw_data(), nbytes) == 0);  // raw little-endian
        total += nbytes;
    }
    CHECK(total == data.size());
    CHECK(header.size() == tensors.size() + 1);
}

TEST_CASE("hostile safetensors files give a qk::Error naming the problem") {
    const std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');
    const std::string a = tensor_entry("F32", "[1]", "[0,4]");
    struct Case {
        const char* what;
        std::string bytes;
        std::vector<std::string> words;
    };
    const std::vector<Case> cases{
        {"empty file", "", {"0 bytes", "too short"}},
        {"short file", "abc", {"3 bytes", "too short"}},
        {"header longer than the file",
         make_file("{}", "", 100),
         {"header length 100", "truncated"}},
        {"header over the cap", make_file("{}", "", 200'000'000), {"200000000", "cap"}},
        {"huge header length", make_file("{}", "", UINT64_MAX - 3), {"cap"}},
        {"empty header", make_file("", ""), {"not valid JSON"}},
        {"not JSON", make_file("{\"a\": [1, 2", four), {"not valid JSON"}},
        {"not UTF-8", make_file("{\"\xff\": 1}", ""), {"not valid JSON"}},
        {"a JSON array", make_file("[1, 2]", ""), {"must be a JSON object"}},
        {"a JSON string", make_file("\"hi\"", ""), {"must be a JSON object"}},
        {"entry not an object",
         make_file(R"({"a": 5})", ""),
         {"'a'", "needs dtype, shape and data_offsets"}},
        {"missing data_offsets",
         make_file(R"({"a":{"dtype":"F32","shape":[1]}})", four),
         {"'a'", "data_offsets"}},
        {"missing dtype",
         make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", four),
         {"'a'", "dtype"}},
        {"dtype not a string",
         make_file(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", four),
         {"'a'", "dtype"}},
        {"unknown dtype",
         make_file(R"({"a":)" + tensor_entry("F8_E4M3", "[4]", "[0,4]") + "}", four),
         {"'a'", "F8_E4M3", "F32, F64, I32, BF16, F16"}},
        {"shape not an array",
         make_file(R"({"a":)" + tensor_entry("F32", "4", "[0,4]") + "}", four),
         {"'a'", "shape must be an array"}},
        {"negative size",
         make_file(R"({"a":)" + tensor_entry("F32", "[-1]", "[0,4]") + "}", four),
         {"'a'", "non-negative integers", "-1"}},
        {"fractional size",
         make_file(R"({"a":)" + tensor_entry("F32", "[1.5]", "[0,4]") + "}", four),
         {"'a'", "1.5"}},
        {"shape product overflows",
         make_file(R"({"a":)" + tensor_entry("F32", "[4294967296,4294967296]", "[0,4]") + "}",
                   four),
         {"'a'", "overflows"}},
        {"empty but strides overflow",
         make_file(R"({"a":)" +
                       tensor_entry("F32", "[0,4611686018427387904,4611686018427387904]", "[0,0]") +
                       "}",
                   ""),
         {"'a'", "overflows"}},
        {"offsets not two integers",
         make_file(R"({"a":)" + tensor_entry("F32", "[1]", "[0]") + "}", four),
         {"'a'", "two non-negative integers"}},
        {"negative offset",
         make_file(R"({"a":)" + tensor_entry("F32", "[1]", "[-4,0]") + "}", four),
         {"'a'", "data_offsets"}},
        {"offsets outside the buffer",
         make_file(R"({"a":)" + tensor_entry("F32", "[1]", "[0,400]") + "}", four),
         {"'a'", "[0, 400)", "outside the 4 byte data buffer"}},
        {"offsets reversed",
         make_file(R"({"a":)" + tensor_entry("F32", "[0]", "[4,0]") + "}", four),
         {"'a'", "[4, 0)"}},
        {"length != dtype size × shape",
         make_file(R"({"a":)" + tensor_entry("F32", "[2]", "[0,4]") + "}", four),
         {"'a'", "holds 4 bytes", "float32 [2] needs 8"}},
        {"overlapping ranges",
         make_file(R"({"a":)" + a + R"(,"b":)" + tensor_entry("F64", "[1]", "[2,10]") + "}",
                   twelve),
         {"overlap"}},
        {"gap between ranges",
         make_file(R"({"a":)" + a + R"(,"b":)" + tensor_entry("F32", "[1]", "[8,12]") + "}",
                   twelve),
         {"gap at byte 4"}},
        {"buffer not covered", make_file(R"({"a":)" + a + "}", eight), {"cover 4 of the 8"}},
        {"duplicate names",
         make_file(R"({"a":)" + a + R"(,"a":)" + a + "}", eight),
         {"'a'", "appears twice"}},
        {"metadata not an object",
         make_file(R"({"__metadata__":[1]})", ""),
         {"__metadata__", "object"}},
        {"metadata value not a string",
         make_file(R"({"__metadata__":{"step":1}})", ""),
         {"__metadata__", "'step'", "string"}},
    };
    for (const auto& c : cases) {
        CAPTURE(c.what);
        const std::string msg = parse_error(c.bytes);
        CAPTURE(msg);
        CHECK(msg.find("hostile.safetensors") != std::string::npos);
        for (const auto& w : c.words)
            CHECK_MESSAGE(msg.find(w) != std::string::npos, "missing '" << w << "'");
    }
    // Sanity: the two-tensor layout used above is accepted when it is right.
    CHECK(parse_safetensors(
              make_file(R"({"a":)" + a + R"(,"b":)" + tensor_entry("F64", "[1]", "[4,12]") + "}",
                        twelve),
              "ok")
              .tensors.size() == 2);
}

TEST_CASE("every truncation and many byte corruptions of a real file fail cleanly") {
    TempDir dir("ckpt_fuzz");
    save_safetensors(dir / "t.safetensors", sample_tensors(), {{"k", "v"}});
    const std::string good = read_file(dir / "t.safetensors");
    CHECK(parse_safetensors(good, "good").tensors.size() == 6);
    int errors = 0;
    for (size_t n = 0; n < good.size(); ++n) {
        try {
            parse_safetensors(good.substr(0, n), "cut");
        } catch (const Error&) {
            ++errors;
        }
    }
    CHECK(errors == static_cast<int>(good.size()));  // a file cut anywhere is always rejected
    // Corrupt one header byte at a time (the data bytes are free-form): Error or success only;
    // any other exception or a crash fails the test (and ASan checks the reads in CI).
    Generator gen(17);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(good[i]);
    for (int trial = 0; trial < 3000; ++trial) {
        std::string bad = good;
        const size_t pos = static_cast<size_t>(gen.uniform() * (8 + n));
        bad[pos] = static_cast<char>(gen.uniform() * 256);
        try {
            parse_safetensors(bad, "corrupt");
        } catch (const Error&) {
        }
    }
    // A truncated file on disk, through load_safetensors.
    write_bytes(dir / "cut.safetensors", good.substr(0, good.size() - 3));
    CHECK(throws_with([&] { load_safetensors(dir / "cut.safetensors"); }, {"cut.safetensors"}));
    CHECK(throws_with([&] { load_safetensors(dir / "absent.safetensors"); },
                      {"cannot open", "absent"}));
}

TEST_CASE("a deeply nested or oversized header is refused before the JSON parser sees it") {
    // Under the 100 MB cap, 20 MB of '[' once took nlohmann::json 14 s and 1.5 GB to reject.
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = parse_error(make_file(std::string(20'000'000, '['), ""));
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    CHECK(msg.find("hostile.safetensors: header nests JSON 20000000 levels deep; at most 8") !=
          std::string::npos);
    CHECK(took.count() < 10);  // sanity only: the scan is linear and takes milliseconds
    CHECK(parse_error(make_file(R"({"a":[[[[[[[[1]]]]]]]]})", "")).find("9 levels deep") !=
          std::string::npos);
    // Elements: a million numbers in a shallow array cost nlohmann::json 16 bytes and more each.
    std::string many = R"({"__metadata__":{"k":[0)";
    for (int i = 0; i < 1'000'000; ++i) many += ",0";
    CHECK(parse_error(make_file(many + "]}}", ""))
              .find("header has 1000003 JSON elements (arrays, objects, commas); at most "
                    "1000000") != std::string::npos);
    // Brackets, braces and commas inside strings, escaped quotes included, are text, not depth.
    const std::string text = R"(\"[[[[[[[[[[{{{{{{{{{{,,\\)";
    const SafetensorsFile f =
        parse_safetensors(make_file(R"({"__metadata__":{"k":")" + text + R"("}})", ""), "ok");
    CHECK(f.metadata.at("k") == R"("[[[[[[[[[[{{{{{{{{{{,,\)");
}

TEST_CASE("only a regular file is read as a checkpoint: a FIFO, a device, a directory are not") {
    TempDir dir("ckpt_special");
    const std::string fifo = dir / "fifo.safetensors";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    // In a child with a deadline: the reader before the fix blocked on the FIFO's open, and read
    // /dev/zero until memory ran out.
    CHECK(error_in_child([&] { load_safetensors(fifo); }) ==
          "safetensors: '" + fifo + "' is a FIFO, not a regular file");
    CHECK(error_in_child([&] { load_safetensors("/dev/zero"); }) ==
          "safetensors: '/dev/zero' is a character device, not a regular file");
    CHECK(error_in_child([&] { load_safetensors(dir.path.string()); }) ==
          "safetensors: '" + dir.path.string() + "' is a directory, not a regular file");
    // The header length is still checked against the real size, before the rest is read.
    write_bytes(dir / "long.safetensors", make_file("{}", "", 1000));
    CHECK(throws_with([&] { load_safetensors(dir / "long.safetensors"); },
                      {"long.safetensors", "header length 1000 runs past the end of the 10 byte"}));
}

TEST_CASE("writes are atomic: no temporary file remains, an existing file is replaced") {
    TempDir dir("ckpt_atomic");
    const std::string path = dir / "m.safetensors";
    save_safetensors(path, {{"x", full({1000}, 1.0)}});
    save_safetensors(path, {{"y", full({3}, 2.0, kF64)}});
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path))
        names.push_back(e.path().filename().string());
    CHECK(names == std::vector<std::string>{"m.safetensors"});
    SafetensorsFile f = load_safetensors(path);
    REQUIRE(f.tensors.size() == 1);
    CHECK(f.tensors[0].first == "y");
    CHECK(f.get("y").to_vector<double>() == std::vector<double>{2, 2, 2});
    // Failure paths: an unwritable place, and names the format reserves or repeats.
    CHECK(throws_with(
        [&] {
            save_safetensors(dir / "no/such/dir/m.safetensors", {{"x", ones({1})}});
        },
        {"no/such/dir/m.safetensors"}));
    CHECK(throws_with(
        [&] {
            save_safetensors(path, {{"x", ones({1})}, {"x", ones({1})}});
        },
        {"'x'", "repeated"}));
    CHECK(throws_with(
        [&] {
            save_safetensors(path, {{"__metadata__", ones({1})}});
        },
        {"reserved"}));
    CHECK(load_safetensors(path).contains("y"));  // a failed save leaves the old file alone
    names.clear();
    for (const auto& e : fs::directory_iterator(dir.path))
        names.push_back(e.path().filename().string());
    CHECK(names.size() == 1);
}

// ---- model and training-state checkpoints --------------------------------------------------

namespace {

GPTConfig small_config() {
    GPTConfig c;
    c.vocab_size = 11, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
    return c;
}

// Gives every parameter distinct values, so that a swapped tensor would show.
void scramble(GPT& model, uint64_t seed) {
    NoGradGuard no_grad;
    Generator gen(seed);
    for (auto& [name, p] : model.named_parameters()) copy_into(p, randn(p.shape(), p.dtype(), gen));
}

}  // namespace

TEST_CASE("save_model / load_model round trip: weights, config and tokenizer restored") {
    TempDir dir("ckpt_model");
    const Tokenizer tok = Tokenizer::char_level("abcdefghij\n");
    for (bool tied : {true, false}) {
        CAPTURE(tied);
        GPTConfig c = small_config();
        c.tie_embeddings = tied, c.qk_norm = QKNorm::l2, c.qk_scale_per_head = true, c.bias = !tied;
        GPT model(c, 5);
        scramble(model, 6);
        const std::string path = dir / "model.safetensors";
        save_model(path, model, tok, {{"step", "42"}});
        LoadedModel loaded = load_model(path);
        CHECK(loaded.model->config().to_strings() == c.to_strings());
        CHECK(loaded.tokenizer.serialize() == tok.serialize());
        CHECK(loaded.metadata.at("step") == "42");
        auto want = model.named_parameters(), got = loaded.model->named_parameters();
        REQUIRE(want.size() == got.size());
        for (size_t i = 0; i < want.size(); ++i) {
            CHECK(got[i].first == want[i].first);
            CHECK(bit_identical(got[i].second, want[i].second));
        }
        Tensor ids = from_ids({1, 2, 3, 4, 5, 6}, {2, 3});
        CHECK(max_abs_diff(loaded.model->forward(ids).logits, model.forward(ids).logits) == 0);
        // Tied: wte is stored once and there is no lm_head; untied: lm_head.weight is stored.
        SafetensorsFile file = load_safetensors(path);
        CHECK(file.tensors.size() == want.size());
        CHECK(file.contains("lm_head.weight") == !tied);
        CHECK(file.contains("transformer.wte.weight"));
        CHECK(file.metadata.at("qk_norm") == "l2");
    }
}

TEST_CASE("loading into another config, or a file missing a tensor, names the tensor and shapes") {
    TempDir dir("ckpt_mismatch");
    const Tokenizer tok = Tokenizer::char_level("abcdefghij\n");
    GPT model(small_config(), 5);
    const std::string path = dir / "model.safetensors";
    save_model(path, model, tok);

    GPTConfig narrow = small_config();
    narrow.n_embd = 8;
    GPT other(narrow, 5);
    CHECK(throws_with([&] { load_weights_into(other, path); },
                      {path, "transformer.wte.weight", "[11, 16]", "[11, 8]"}));
    GPTConfig deeper = small_config();
    deeper.n_layer = 3;
    GPT three(deeper, 5);
    CHECK(throws_with([&] { load_weights_into(three, path); },
                      {"transformer.h.2.ln_1.weight", "missing"}));
    GPTConfig shallow = small_config();
    shallow.n_layer = 1;
    GPT one(shallow, 5);
    const Tensor before = one.named_parameters()[0].second.clone();
    CHECK(throws_with([&] { load_weights_into(one, path); },
                      {"transformer.h.1.", "not a parameter"}));
    CHECK(max_abs_diff(one.named_parameters()[0].second, before) == 0);  // nothing half-loaded
    GPT f64(small_config(), 5, kF64);
    CHECK(throws_with([&] { load_weights_into(f64, path); }, {"float32", "float64"}));

    // A file without one tensor, and one whose config metadata is hostile.
    auto params = model.named_parameters();
    std::vector<std::pair<std::string, Tensor>> partial;
    for (const auto& p : params)
        if (p.first != "transformer.h.1.ln_2.bias") partial.push_back(p);
    auto metadata = model.config().to_strings();
    metadata["tokenizer"] = tok.serialize();
    save_safetensors(dir / "partial.safetensors", partial, metadata);
    CHECK(throws_with([&] { load_model(dir / "partial.safetensors"); },
                      {"'transformer.h.1.ln_2.bias'", "missing"}));
    auto huge = metadata;
    // The widest model the config accepts needs billions of values: refused before allocating.
    huge["n_embd"] = "65536", huge["n_head"] = "1";
    save_safetensors(dir / "huge.safetensors", params, huge);
    CHECK(throws_with([&] { load_model(dir / "huge.safetensors"); }, {"C=65536", "file holds"}));
    huge["n_embd"] = "1000000000";  // and a width past the config's bound is named as such
    save_safetensors(dir / "huger.safetensors", params, huge);
    CHECK(throws_with([&] { load_model(dir / "huger.safetensors"); },
                      {"n_embd", "1000000000", "[1, 65536]"}));
    auto no_tok = model.config().to_strings();
    save_safetensors(dir / "notok.safetensors", params, no_tok);
    CHECK(throws_with([&] { load_model(dir / "notok.safetensors"); }, {"tokenizer"}));
    auto wrong_vocab = metadata;
    // Fewer symbols than rows is a fine-tuned import; more would index past the embedding.
    wrong_vocab["tokenizer"] = Tokenizer::char_level("abcdefghijklmnopqrstuvwxyz").serialize();
    save_safetensors(dir / "vocab.safetensors", params, wrong_vocab);
    CHECK(throws_with([&] { load_model(dir / "vocab.safetensors"); },
                      {"tokenizer has 26", "vocab_size 11"}));
    wrong_vocab["tokenizer"] = Tokenizer::char_level("abc").serialize();
    save_safetensors(dir / "fewer.safetensors", params, wrong_vocab);
    CHECK(load_model(dir / "fewer.safetensors").tokenizer.vocab_size() == 3);
    auto bad_field = metadata;
    bad_field.erase("qk_norm");
    save_safetensors(dir / "field.safetensors", params, bad_field);
    CHECK(throws_with([&] { load_model(dir / "field.safetensors"); }, {"qk_norm", "missing"}));
}

TEST_CASE("training state round trip: optimizer tensors, step counts and generator states") {
    TempDir dir("ckpt_state");
    for (const bool muon : {false, true}) {
        CAPTURE(muon);
        GPT model(small_config(), 5);
        RunOptimizerOptions options;
        options.muon = muon;
        RunOptimizer opt(model.named_parameters(), options);
        Tensor ids = from_ids({1, 2, 3, 4, 5, 6}, {2, 3}),
               targets = from_ids({2, 3, 4, 5, 6, 7}, {2, 3});
        for (int i = 0; i < 3; ++i) {
            model.forward(ids, targets).loss.backward();
            opt.step(1e-2);
            opt.zero_grad();
        }
        TrainingState state{3, 77, 123, 88, 456, {{"train_config", "{}"}}};
        const OptimizerState saved = opt.state();
        CHECK(saved.steps == 3);
        save_training_state(dir / "s.safetensors", saved, state);
        GPT fresh(small_config(), 9);
        RunOptimizer opt2(fresh.named_parameters(), options);
        OptimizerState back_state = opt2.state();
        TrainingState back = load_training_state(dir / "s.safetensors", back_state);
        opt2.load(back_state);
        CHECK(back.step == 3);
        CHECK(back.data_seed == 77);
        CHECK(back.data_counter == 123);
        CHECK(back.dropout_seed == 88);
        CHECK(back.dropout_counter == 456);
        CHECK(back.extra.at("train_config") == "{}");
        const OptimizerState reloaded = opt2.state();
        CHECK(reloaded.steps == 3);
        REQUIRE(reloaded.tensors.size() == saved.tensors.size());
        for (size_t i = 0; i < saved.tensors.size(); ++i) {
            CHECK(reloaded.tensors[i].first == saved.tensors[i].first);
            CHECK(bit_identical(reloaded.tensors[i].second, saved.tensors[i].second));
        }
        // The state file of another model is rejected, naming the optimizer tensor.
        GPTConfig narrow = small_config();
        narrow.n_embd = 8;
        GPT other(narrow, 5);
        OptimizerState other_state = RunOptimizer(other.named_parameters(), options).state();
        CHECK(throws_with([&] { load_training_state(dir / "s.safetensors", other_state); },
                          {"exp_avg.transformer.wte.weight", "[11, 8]"}));
    }
    // AdamW's state does not resume a Muon run: Muon's momentum is missing, by name.
    GPT model(small_config(), 5);
    save_training_state(dir / "adamw.safetensors",
                        RunOptimizer(model.named_parameters(), {}).state(), TrainingState{});
    RunOptimizerOptions with_muon;
    with_muon.muon = true;
    OptimizerState muon_state = RunOptimizer(model.named_parameters(), with_muon).state();
    CHECK(throws_with([&] { load_training_state(dir / "adamw.safetensors", muon_state); },
                      {"muon_momentum.transformer.h.0.attn.c_attn.weight.q", "missing"}));
}

// ---- the config's string form (checkpoint metadata)
// ----------------------------------------------------------------------------
