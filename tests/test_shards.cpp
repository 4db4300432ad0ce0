// Token files (nn/text/shards.h): llm.c's shards and nanoGPT's train.bin / val.bin as their own
// scripts write them (tests/data/shards, made by tools/make_shard_fixtures.py), hostile files,
// batches from memory-mapped shards, `prepare_token_shards`, and a run trained from shards.
#include <filesystem>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "helpers.h"
#include "nn.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using namespace qk::test;

namespace {

std::string shard_fixture(const std::string& name) {
    const char* dir = std::getenv("SHARD_FIXTURES");
    REQUIRE_MESSAGE(dir, "SHARD_FIXTURES is not set (meson test sets it)");
    return std::string(dir) + "/" + name;
}

std::vector<int32_t> expected_tokens(const std::string& name, int64_t n, int64_t vocab) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < n; ++i)
        t.push_back(static_cast<int32_t>((i * 7919 + static_cast<int64_t>(name.size())) % vocab));
    return t;
}

std::vector<int32_t> read_all(const TokenSequence& s) {
    std::vector<int32_t> out(static_cast<size_t>(s.size()));
    s.read(0, s.size(), out.data());
    return out;
}

std::string header(int32_t magic, int32_t version, int32_t count) {
    std::string h(1024, '\0');
    const int32_t v[3] = {magic, version, count};
    std::memcpy(h.data(), v, sizeof v);
    return h;
}

}  // namespace

TEST_CASE("llm.c's and nanoGPT's token files read back exactly") {
    for (auto [name, n, vocab] :
         {std::tuple{"llmc_u16_val.bin", 300, 65536}, std::tuple{"llmc_u16_train.bin", 1000, 65536},
          std::tuple{"llmc_u32_train.bin", 700, 200000}}) {
        INFO(name);
        const auto seq = map_token_files({shard_fixture(name)}, 200000);
        CHECK(read_all(*seq) == expected_tokens(name, n, vocab));
    }
    const auto nano = map_token_files(
        {shard_fixture("nanogpt/train.bin"), shard_fixture("nanogpt/val.bin")}, 65536);
    std::vector<int32_t> both = expected_tokens("train.bin", 900, 65536);
    const auto val = expected_tokens("val.bin", 200, 65536);
    both.insert(both.end(), val.begin(), val.end());
    CHECK(read_all(*nano) == both);
    std::vector<int32_t> across(10);  // a window running from one file into the next
    nano->read(895, 10, across.data());
    CHECK(std::equal(across.begin(), across.end(), both.begin() + 895));
    const TokenFiles found = find_token_files(shard_fixture("nanogpt"));
    CHECK(found.train.size() == 1);
    CHECK(found.val.size() == 1);
}

TEST_CASE("write_token_shard writes what llm.c reads, uint16 and uint32") {
    TempDir dir("shards_write");
    const std::vector<uint32_t> small{0, 1, 65535, 42}, large{0, 70000, 4000000000u};
    write_token_shard(dir / "a.bin", small, 2);
    write_token_shard(dir / "b.bin", large, 4);
    const std::string a = read_file(dir / "a.bin");
    CHECK(a.size() == 1024 + 8);
    CHECK(a.substr(0, 12) == header(20240520, 1, 4).substr(0, 12));
    CHECK(read_file(dir / "b.bin").substr(0, 12) == header(20240801, 7, 3).substr(0, 12));
    CHECK(read_all(*map_token_files({dir / "a.bin"}, 65536)) ==
          std::vector<int32_t>{0, 1, 65535, 42});
    CHECK(throws_with([&] { write_token_shard(dir / "c.bin", large, 2); }, {"uint16"}));
    CHECK(throws_with([&] { read_all(*map_token_files({dir / "b.bin"}, 1 << 30)); },
                      {"token 4000000000", "b.bin"}));
}

TEST_CASE("hostile token files give a clean error naming the file") {
    TempDir dir("shards_hostile");
    const std::string two_tokens = std::string("\x01\x00\x02\x00", 4);
    struct Case {
        std::string path, fragment;
    };
    const std::vector<Case> cases = {
        {write_file(dir, "magic_train.bin", header(12345, 1, 2) + two_tokens), "magic"},
        {write_file(dir, "version_train.bin", header(20240520, 7, 2) + two_tokens), "version 7"},
        {write_file(dir, "past_end_train.bin", header(20240520, 1, 1000) + two_tokens),
         "runs past the end"},
        {write_file(dir, "short_train.bin", header(20240520, 1, 1) + two_tokens),
         "says it holds 1 tokens"},
        {write_file(dir, "negative_train.bin", header(20240520, 1, -5) + two_tokens), "-5"},
        {write_file(dir, "truncated_train.bin", header(20240520, 1, 2).substr(0, 500)),
         "shorter than llm.c's 1024-byte header"},
        {write_file(dir, "empty_train.bin", header(20240520, 1, 0)), "holds no tokens"},
        {write_file(dir, "train.bin", "abc"), "not a whole number of uint16"},
        {write_file(dir, "zero_train.bin", ""), "magic"},
        {write_file(dir, "id_train.bin", header(20240520, 1, 2) + two_tokens), "outside"},
    };
    for (const Case& c : cases) {
        INFO(c.path);
        CHECK(throws_with([&] { read_all(*map_token_files({c.path}, 2)); }, {c.fragment, c.path}));
    }
    // An id past the vocabulary deep in a file is refused when the file is opened, before any
    // window reads it (a run once died at step 28 on one, with no checkpoint).
    std::vector<uint32_t> ids(100000, 1);
    ids[77777] = 9;
    write_token_shard(dir / "late_train.bin", ids, 2);
    CHECK(throws_with([&] { map_token_files({dir / "late_train.bin"}, 5); },
                      {"token 9 at position 77777", "late_train.bin", "vocabulary of 5"}));
    CHECK(map_token_files({dir / "late_train.bin"}, 10)->size() == 100000);
    CHECK(throws_with([&] { map_token_files({dir.path.string()}, 10); }, {"directory"}));
    CHECK(throws_with([&] { find_token_files(dir / "nowhere"); }, {"not a directory"}));
    TempDir only_train("shards_only_train");
    write_token_shard(only_train / "x_train_000001.bin", {1, 2, 3}, 2);
    CHECK(throws_with([&] { find_token_files(only_train.path.string()); }, {"0 val"}));
}

TEST_CASE("batches from shards: windows of the stream, only the rows a rank reads") {
    const auto train = map_token_files({shard_fixture("llmc_u16_train.bin")}, 65536);
    const auto val = map_token_files({shard_fixture("llmc_u16_val.bin")}, 65536);
    const TextDataset data(train, val, 8);
    const std::vector<int32_t> all = read_all(*train);
    Generator gen(3), again(3);
    Tensor ids, targets, some_ids, some_targets;
    data.batch(true, 6, gen, ids, targets);
    data.batch(true, 6, again, some_ids, some_targets, [](int64_t row) { return row % 2 == 1; });
    const auto x = ids.to_vector<int32_t>(), y = targets.to_vector<int32_t>();
    const auto sx = some_ids.to_vector<int32_t>();
    for (int64_t b = 0; b < 6; ++b) {
        const auto start =
            std::search(all.begin(), all.end(), x.begin() + b * 8, x.begin() + b * 8 + 8);
        REQUIRE(start != all.end());
        CHECK(std::equal(y.begin() + b * 8, y.begin() + b * 8 + 8, start + 1));
        for (int64_t t = 0; t < 8; ++t)
            CHECK(sx[static_cast<size_t>(b * 8 + t)] ==
                  (b % 2 ? x[static_cast<size_t>(b * 8 + t)] : 0));
    }
    CHECK(gen.uniform() == again.uniform());  // both drew the same starts
}

TEST_CASE("prepare: shards of a corpus, split as --data FILE splits it") {
    TempDir dir("shards_prepare");
    const std::string text = read_file(write_corpus(dir));
    BpeTrainOptions options;
    options.vocab_size = 300;
    const Tokenizer tok = train_bpe({text}, options);
    PrepareOptions prep;
    prep.out_dir = dir / "out";
    prep.shard_tokens = 1024;
    int64_t last_done = 0;
    prep.progress = [&](int64_t done, int64_t) { last_done = done; };
    const PrepareSummary s = prepare_token_shards(tok, {dir / "corpus.txt"}, prep);
    CHECK(last_done == static_cast<int64_t>(text.size()));
    const auto split = static_cast<size_t>(static_cast<double>(text.size()) * 0.9);
    CHECK(s.train_bytes == static_cast<int64_t>(split));
    CHECK(s.val_bytes == static_cast<int64_t>(text.size() - split));
    const TokenFiles files = find_token_files(prep.out_dir);
    CHECK(files.train.size() > 1);  // 1024 tokens a shard
    std::vector<int32_t> train = read_all(*map_token_files(files.train, tok.vocab_size()));
    const std::vector<int32_t> val = read_all(*map_token_files(files.val, tok.vocab_size()));
    CHECK(train.front() == *tok.document_separator());
    train.erase(train.begin());
    CHECK(tok.decode(train) == text.substr(0, split));
    CHECK(tok.decode(val) == text.substr(split));
    CHECK(static_cast<int64_t>(train.size() + 1) == s.train_tokens);

    SUBCASE("JSONL documents, whole, each after the separator") {
        std::string jsonl;
        for (int i = 0; i < 20; ++i)
            jsonl += nlohmann::json{{"text", fmt::format("story {} <|endoftext|> é\n", i)}}.dump() +
                     "\n";
        write_file(dir, "docs.jsonl", jsonl + "\n");
        prep.out_dir = dir / "jsonl";
        const PrepareSummary js = prepare_token_shards(tok, {dir / "docs.jsonl"}, prep);
        CHECK(js.documents == 20);
        const TokenFiles jf = find_token_files(prep.out_dir);
        std::vector<int32_t> all = read_all(*map_token_files(jf.train, tok.vocab_size()));
        const auto jv = read_all(*map_token_files(jf.val, tok.vocab_size()));
        all.insert(all.end(), jv.begin(), jv.end());
        std::string expected;
        for (int i = 0; i < 20; ++i)
            expected += fmt::format("<|endoftext|>story {} <|endoftext|> é\n", i);
        CHECK(tok.decode(all) == expected);  // the literal <|endoftext|> came back as text...
        CHECK(std::count(all.begin(), all.end(), *tok.document_separator()) == 20);  // ...not ids
        // Whole documents: the one the 90 % cut falls inside goes to validation, as do those
        // after it (the bytes of the file, its last empty line included, set the cut).
        const std::string file = jsonl + "\n";
        const auto cut = static_cast<size_t>(static_cast<double>(file.size()) * 0.9);
        std::string expected_val;
        bool straddled = false;
        for (size_t begin = 0, i = 0; i < 20; ++i) {
            const size_t end = file.find('\n', begin);
            straddled |= begin < cut && cut < end;
            if (end > cut)
                expected_val += fmt::format("<|endoftext|>story {} <|endoftext|> é\n", i);
            begin = end + 1;
        }
        REQUIRE(straddled);  // else this would not test the document on the cut
        CHECK(tok.decode(jv) == expected_val);
    }
    SUBCASE("refusals") {
        CHECK(throws_with([&] { prepare_token_shards(tok, {dir / "corpus.txt"}, prep); },
                          {"already holds"}));
        write_file(dir, "empty.txt", "");
        prep.out_dir = dir / "other";
        CHECK(throws_with([&] { prepare_token_shards(tok, {dir / "empty.txt"}, prep); },
                          {"0 bytes"}));
        write_file(dir, "bad.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
        CHECK(throws_with([&] { prepare_token_shards(tok, {dir / "bad.jsonl"}, prep); },
                          {"bad.jsonl line 2", "\"text\""}));
        // A line nested 200,000 deep is measured, not parsed (the parser's nodes took gigabytes).
        write_file(
            dir, "deep.jsonl",
            "{\"text\": \"a\"}\n" + std::string(200000, '[') + std::string(200000, ']') + "\n");
        CHECK(throws_with([&] { prepare_token_shards(tok, {dir / "deep.jsonl"}, prep); },
                          {"deep.jsonl line 2", "nested 200000 deep"}));
        CHECK(throws_with([&] { prepare_token_shards(tok, {dir / "missing.txt"}, prep); },
                          {"does not exist"}));
    }
    SUBCASE("--name is a file name: nothing is written outside --out") {
        prep.out_dir = dir / "named";
        for (const std::string name : {"../escaped", "/tmp/abs", "sub/data", "..", ".", ""}) {
            CAPTURE(name);
            prep.name = name;
            CHECK(throws_with([&] { prepare_token_shards(tok, {dir / "corpus.txt"}, prep); },
                              {"--name must be a file name", "inside --out"}));
        }
        CHECK_FALSE(std::filesystem::exists(dir / "escaped_val_000000.bin"));
        CHECK_FALSE(std::filesystem::exists(dir / "named"));  // refused before anything is made
    }
    SUBCASE("a run that fails half way leaves no shard behind, and the rerun works") {
        // Enough text for several train shards before the bad second input is reached.
        write_file(dir, "bad.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
        prep.out_dir = dir / "half";
        CHECK(throws_with(
            [&] {
                prepare_token_shards(tok, {dir / "corpus.txt", dir / "bad.jsonl"}, prep);
            },
            {"bad.jsonl line 2"}));
        CHECK(std::filesystem::is_empty(prep.out_dir));
        const PrepareSummary again = prepare_token_shards(tok, {dir / "corpus.txt"}, prep);
        CHECK(again.files.size() == s.files.size());
    }
}

TEST_CASE("a model trains from shards, reporting bits per byte") {
    TempDir dir("shards_train");
    TrainConfig cfg = tiny_run(dir, "run");
    const std::string text = read_file(cfg.data_path);
    BpeTrainOptions options;
    options.vocab_size = 300;
    train_bpe({text}, options).save(dir / "tok.json");
    PrepareOptions prep;
    prep.out_dir = dir / "shards";
    prepare_token_shards(Tokenizer::from_file(dir / "tok.json"), {cfg.data_path}, prep);
    cfg.data_path = prep.out_dir;
    cfg.tokenizer = dir / "tok.json";
    const TrainResult r = train(cfg);
    CHECK(r.steps_done == cfg.steps);
    CHECK(std::isfinite(r.final_val_loss));
    const TrainingData input = load_training_data(cfg);
    CHECK(input.val_bytes_per_token > 1.5);  // BPE tokens hold several bytes
    CHECK(r.final_val_bpb == doctest::Approx(input.bits_per_byte(r.final_val_loss)));
    const LoadedModel loaded = load_model(latest_model_checkpoint(cfg.run_dir));
    CHECK(loaded.tokenizer.kind() == "bpe");
    CHECK(loaded.tokenizer.encode("Speak, speak.") ==
          Tokenizer::from_file(dir / "tok.json").encode("Speak, speak."));
    CHECK(Tokenizer::from_file(latest_model_checkpoint(cfg.run_dir)).vocab_size() == 300);
    CHECK(Tokenizer::from_file(cfg.run_dir).vocab_size() == 300);

    cfg.tokenizer = "char";
    CHECK(throws_with([&] { load_training_data(cfg); }, {"directory of token files"}));
    // With the flags' checks (a usage error before the run's header), not only at opening.
    CHECK(throws_with([&] { cfg.validate(); }, {"directory of token files", "--tokenizer"}));
    TrainConfig text_run = tiny_run(dir, "chars");
    CHECK(load_training_data(text_run).val_bytes_per_token == 1.0);
}
