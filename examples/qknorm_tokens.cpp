#include "qknorm_tokens.h"

#include <unistd.h>

#include <fmt/core.h>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "examples/progress.h"
#include "examples/qknorm_flags.h"
#include "nn/text/data.h"
#include "nn/train/trainer.h"

namespace qk::cli {

namespace {

std::vector<int32_t> parse_ids(const std::vector<std::string>& words) {
    std::vector<int32_t> ids;
    for (const std::string& w : words) {
        size_t used = 0;
        long long v = -1;
        try {
            v = std::stoll(w, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        QK_CHECK(used == w.size() && v >= 0 && v <= INT32_MAX,
                 "tokenizer decode: '{}' is not a token id (a whole number >= 0)", w);
        ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
}

}  // namespace

CLI::App* add_tokenizer_command(CLI::App& app, TokenizerArgs& args) {
    CLI::App* cmd = app.add_subcommand(
        "tokenizer", "train a byte-level BPE tokenizer, or encode / decode with any tokenizer");
    cmd->require_subcommand(1);
    args.train = cmd->add_subcommand(
        "train", "learn byte-level BPE merges from text files (GPT-2's pre-tokenizer)");
    args.train
        ->add_option("--vocab-size", args.options.vocab_size,
                     "ids in all: the special tokens, the 256 bytes and one per merge")
        ->check(CLI::Range(int64_t{257}, int64_t{1} << 22))
        ->capture_default_str();
    args.train->add_option("--out", args.out, "the tokenizer.json to write")->required();
    args.train
        ->add_option("--special", args.options.special_tokens,
                     "special tokens, given the first ids (repeatable)")
        ->allow_extra_args(false)  // "[PAD]" is a token, not a list holding PAD
        ->capture_default_str();
    args.train
        ->add_option("--min-frequency", args.options.min_frequency,
                     "stop when the best pair occurs fewer times than this")
        ->check(CLI::Range(int64_t{0}, INT64_MAX))
        ->capture_default_str();
    add_verbatim_positionals(args.train, "files", args.inputs,
                             "the text files to learn from (default: bundled Tiny Shakespeare)");
    args.train->add_flag("--quiet", args.quiet, "no progress bar");

    args.encode = cmd->add_subcommand("encode", "print the ids of a text, one line");
    args.decode = cmd->add_subcommand(
        "decode", "print the text of ids, byte for byte (a newline after it on a terminal only)");
    for (CLI::App* sub : {args.encode, args.decode})
        sub->add_option("--tokenizer", args.tokenizer,
                        "a tokenizer.json, tokenizer.model, a directory holding one, or a qknorm "
                        "checkpoint")
            ->required();
    args.encode->add_option("--text", args.text, "the text to encode");
    args.encode->add_option("--file", args.file, "a file whose text to encode");
    args.encode->add_flag("--ordinary", args.ordinary,
                          "special tokens written in the text stay text");
    args.decode->add_option("ids", args.inputs, "token ids")->required();
    return cmd;
}

// --out checked before the merges are learned (`--out /` failed after the whole training): not a
// directory, and in a directory that exists and can be written.
void check_tokenizer_out(const std::string& out) {
    namespace fs = std::filesystem;
    QK_CHECK(!fs::is_directory(out),
             "tokenizer train: --out {} is a directory; name the tokenizer.json file to write",
             out);
    const fs::path parent =
        fs::path(out).parent_path().empty() ? fs::path(".") : fs::path(out).parent_path();
    QK_CHECK(fs::is_directory(parent), "tokenizer train: --out {}: the directory {} does not exist",
             out, parent.string());
    QK_CHECK(::access(parent.c_str(), W_OK) == 0,
             "tokenizer train: --out {}: the directory {} cannot be written", out, parent.string());
}

int run_tokenizer(const TokenizerArgs& args) {
    if (args.train->parsed()) {
        check_tokenizer_out(args.out);
        std::vector<std::string> texts, files = args.inputs;
        if (files.empty()) files.push_back(nn::default_data_path());
        for (const std::string& f : files)
            texts.push_back(read_regular_file(f, "tokenizer train", nn::kMaxTextFileBytes));
        nn::BpeTrainOptions options = args.options;
        Progress reading("reading", args.quiet), merging("merges", args.quiet);
        options.progress = [&](const char* phase, int64_t done, int64_t total) {
            if (std::string(phase) == "read")
                reading(done, total, "MB");
            else
                merging(done, total, "merges");
        };
        const nn::Tokenizer tok = nn::train_bpe(texts, options);
        tok.save(args.out);
        fmt::print("{}: byte-level BPE with {} ids\n", args.out, tok.vocab_size());
        return 0;
    }
    const nn::Tokenizer tok = nn::Tokenizer::from_file(args.tokenizer);
    if (args.encode->parsed()) {
        QK_CHECK(args.text.empty() != args.file.empty(),
                 "tokenizer encode: give the text as --text TEXT or --file FILE (one of them)");
        const std::string text =
            args.file.empty()
                ? args.text
                : read_regular_file(args.file, "tokenizer encode", nn::kMaxTextFileBytes);
        fmt::print("{}\n", fmt::join(tok.encode(text, !args.ordinary), " "));
        return 0;
    }
    std::string text;  // ids that are not numbers, or not the tokenizer's: usage errors (exit 2)
    as_usage([&] { text = tok.decode(parse_ids(args.inputs)); });
    // The text byte for byte, so that encode then decode through a pipe or a file gives it back;
    // a newline only for a terminal, where the shell's prompt would follow the text on its line.
    fmt::print("{}{}", text, ::isatty(1) == 1 ? "\n" : "");
    return 0;
}

CLI::App* add_prepare_command(CLI::App& app, PrepareArgs& args) {
    CLI::App* cmd = app.add_subcommand(
        "prepare", "tokenize a corpus into token shards in llm.c's format (train with --data DIR)");
    cmd->add_option("--tokenizer", args.tokenizer,
                    "a tokenizer.json, tokenizer.model, a directory holding one, or 'byte'")
        ->required();
    cmd->add_option("--out", args.options.out_dir, "the directory to write the shards to")
        ->required();
    cmd->add_option("--name", args.options.name,
                    "shard names: NAME_val_000000.bin, ... (a file name, written inside --out)")
        ->capture_default_str();
    cmd->add_option("--val-fraction", args.options.val_fraction,
                    "the last fraction of the input bytes, for validation")
        ->capture_default_str();
    cmd->add_option("--shard-tokens", args.options.shard_tokens, "tokens per train shard")
        ->capture_default_str();
    cmd->add_option("--text-field", args.options.text_field,
                    "the field holding each JSONL line's document")
        ->capture_default_str();
    add_verbatim_positionals(cmd, "inputs", args.inputs,
                             "text files, JSONL files (.jsonl) or directories of them (default: "
                             "bundled Tiny Shakespeare)");
    cmd->add_flag("--quiet", args.quiet, "no progress bar");
    return cmd;
}

int run_prepare(PrepareArgs args) {
    QK_CHECK(args.tokenizer != "char",
             "prepare: --tokenizer char depends on the text; use 'byte' or a tokenizer file");
    const nn::Tokenizer tok = nn::Tokenizer::from_flag(args.tokenizer, "");
    if (args.inputs.empty()) args.inputs.push_back(nn::default_data_path());
    Progress progress("tokenizing", args.quiet);
    args.options.progress = [&](int64_t done, int64_t total) { progress(done, total, "MB"); };
    const auto t0 = std::chrono::steady_clock::now();
    const nn::PrepareSummary s = nn::prepare_token_shards(tok, args.inputs, args.options);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t bytes = s.train_bytes + s.val_bytes, tokens = s.train_tokens + s.val_tokens;
    fmt::print("{} documents, {} bytes -> {} tokens ({:.3f} bytes per token), uint{} in {:.1f} s\n",
               s.documents, bytes, tokens, static_cast<double>(bytes) / static_cast<double>(tokens),
               8 * s.token_bytes, seconds);
    fmt::print("train: {} tokens, val: {} tokens\n", s.train_tokens, s.val_tokens);
    for (const std::string& f : s.files) fmt::print("  {}\n", f);
    return 0;
}

}  // namespace qk::cli
