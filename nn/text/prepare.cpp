#include "nn/text/prepare.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "nn/text/data.h"
#include "nn/text/shards.h"

namespace qk::nn {

namespace fs = std::filesystem;

namespace {

struct Input {
    std::string path;
    bool jsonl;
    uint64_t bytes;
};

std::vector<Input> list_inputs(const std::vector<std::string>& args) {
    std::vector<Input> inputs;
    auto add = [&](const fs::path& p) {
        inputs.push_back({p.string(), p.extension() == ".jsonl", fs::file_size(p)});
    };
    for (const std::string& arg : args) {
        QK_CHECK(fs::exists(arg), "prepare: input '{}' does not exist", arg);
        if (!fs::is_directory(arg)) {
            add(arg);
            continue;
        }
        std::vector<fs::path> found;
        for (const auto& entry : fs::recursive_directory_iterator(arg)) {
            const auto ext = entry.path().extension();
            if (entry.is_regular_file() && (ext == ".txt" || ext == ".md" || ext == ".jsonl"))
                found.push_back(entry.path());
        }
        std::sort(found.begin(), found.end());
        QK_CHECK(!found.empty(), "prepare: directory '{}' holds no .txt, .md or .jsonl file", arg);
        for (const fs::path& p : found) add(p);
    }
    QK_CHECK(!inputs.empty(), "prepare: no inputs (give text files, JSONL files or directories)");
    return inputs;
}

// Shards filled as tokens arrive: the validation split into NAME_val_*, the rest into
// NAME_train_* (llm.c numbers its first train shard 1, after the validation shard 0).
class ShardWriter {
  public:
    ShardWriter(const PrepareOptions& options, int token_bytes, PrepareSummary& summary)
        : options_(options), token_bytes_(token_bytes), summary_(summary) {}

    void add(const std::vector<int32_t>& ids, bool val) {
        auto& buffer = val ? val_ : train_;
        (val ? summary_.val_tokens : summary_.train_tokens) += static_cast<int64_t>(ids.size());
        for (int32_t id : ids) {
            buffer.push_back(static_cast<uint32_t>(id));
            if (!val && static_cast<int64_t>(buffer.size()) == options_.shard_tokens) flush(false);
        }
    }
    void finish() {
        flush(true);
        if (!train_.empty()) flush(false);
    }

  private:
    void flush(bool val) {
        auto& buffer = val ? val_ : train_;
        const std::string path = (fs::path(options_.out_dir) /
                                  fmt::format("{}_{}_{:06d}.bin", options_.name,
                                              val ? "val" : "train", val ? 0 : ++train_shards_))
                                     .string();
        write_token_shard(path, buffer, token_bytes_);
        summary_.files.push_back(path);
        buffer.clear();
    }
    const PrepareOptions& options_;
    int token_bytes_;
    PrepareSummary& summary_;
    std::vector<uint32_t> train_, val_;
    int train_shards_ = 0;
};

// Where a long text can be cut and each side encoded alone with the same tokens as the whole:
// after a newline and before an ASCII letter or digit (no pre-tokenizer piece of GPT-2's, Qwen's
// or cl100k's regex runs across it, and NFC leaves ASCII alone). Within about 1 MB of `from`.
size_t safe_cut(std::string_view text, size_t from) {
    size_t at = std::min(text.size(), from + (size_t{1} << 20));
    while (at < text.size() &&
           !(text[at - 1] == '\n' && std::isalnum(static_cast<unsigned char>(text[at]))))
        ++at;
    return at;
}

// --name names files inside --out and nothing else: no directory part, no "." or "..".
bool is_file_name(const std::string& name) {
    return !name.empty() && name != "." && name != ".." &&
           name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

}  // namespace

PrepareSummary prepare_token_shards(const Tokenizer& tokenizer,
                                    const std::vector<std::string>& input_args,
                                    const PrepareOptions& options) {
    QK_CHECK(options.val_fraction > 0 && options.val_fraction < 1,
             "prepare: --val-fraction must be in (0, 1), got {}", options.val_fraction);
    QK_CHECK(options.shard_tokens >= 1024, "prepare: --shard-tokens must be >= 1024, got {}",
             options.shard_tokens);
    QK_CHECK(is_file_name(options.name),
             "prepare: --name must be a file name, got '{}': shards go inside --out ({}) only, "
             "so no '/', no '..' and not empty",
             options.name, options.out_dir);
    const std::vector<Input> inputs = list_inputs(input_args);
    uint64_t total = 0;
    for (const Input& in : inputs) total += in.bytes;
    QK_CHECK(total > 0, "prepare: the inputs hold no text (0 bytes)");
    fs::create_directories(options.out_dir);
    for (const auto& entry : fs::directory_iterator(options.out_dir))
        QK_CHECK(entry.path().filename().string().rfind(options.name + "_", 0) != 0 ||
                     entry.path().extension() != ".bin",
                 "prepare: {} already holds {}; remove its {}_*.bin files or choose another "
                 "--out or --name",
                 options.out_dir, entry.path().filename().string(), options.name);

    PrepareSummary summary;
    try {
        summary.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
        ShardWriter writer(options, summary.token_bytes, summary);
        const auto cut =
            static_cast<uint64_t>(static_cast<double>(total) * (1 - options.val_fraction));
        const std::optional<int32_t> separator = tokenizer.document_separator();
        uint64_t position = 0, done = 0;  // input bytes before the current file; read so far
        // Text of one split, encoded in pieces cut where safe (progress moves, memory stays small).
        auto encode_into = [&](std::string_view text, bool val) {
            for (size_t begin = 0; begin < text.size();) {
                const size_t end = safe_cut(text, begin);
                writer.add(tokenizer.encode(text.substr(begin, end - begin), false), val);
                (val ? summary.val_bytes : summary.train_bytes) +=
                    static_cast<int64_t>(end - begin);
                done += end - begin;
                if (options.progress)
                    options.progress(static_cast<int64_t>(done), static_cast<int64_t>(total));
                begin = end;
            }
        };
        auto separate = [&](bool val) {
            ++summary.documents;
            if (separator) writer.add({*separator}, val);
        };
        for (const Input& in : inputs) {
            const std::string bytes = read_regular_file(in.path, "prepare", kMaxTextFileBytes);
            if (!in.jsonl) {  // one document, cut at the split if it crosses it
                const std::string_view text(bytes);
                const size_t split =
                    position >= cut
                        ? 0
                        : static_cast<size_t>(std::min<uint64_t>(cut - position, bytes.size()));
                separate(split == 0);
                encode_into(text.substr(0, split), false);
                encode_into(text.substr(split), true);
            }
            size_t line_begin = 0;
            for (int64_t line = 1; in.jsonl && line_begin < bytes.size(); ++line) {
                size_t line_end = bytes.find('\n', line_begin);
                if (line_end == std::string::npos) line_end = bytes.size();
                const std::string_view text(bytes.data() + line_begin, line_end - line_begin);
                if (text.find_first_not_of(" \t\r") != std::string_view::npos) {
                    // Measured first: a line nested millions deep would take gigabytes to parse.
                    check_json_extent(text, fmt::format("prepare: {} line {}", in.path, line), 64,
                                      uint64_t{1} << 24);
                    const auto j = nlohmann::json::parse(text, nullptr, false);
                    QK_CHECK(j.is_object() && j.contains(options.text_field) &&
                                 j[options.text_field].is_string(),
                             "prepare: {} line {} is not a JSON object with a string \"{}\" field",
                             in.path, line, options.text_field);
                    const bool val = position + line_end > cut;  // whole documents: past the cut
                    separate(val);
                    encode_into(j[options.text_field].get<std::string>(), val);
                }
                line_begin = line_end + 1;
            }
            position += in.bytes;
        }
        QK_CHECK(summary.val_tokens > 0 && summary.train_tokens > 0,
                 "prepare: {} train and {} validation tokens: both splits need some (more text, or "
                 "another --val-fraction)",
                 summary.train_tokens, summary.val_tokens);
        writer.finish();
    } catch (...) {  // a half-written dataset is worse than none: the rerun would be refused
        for (const std::string& file : summary.files) {
            std::error_code ignored;
            fs::remove(file, ignored);
        }
        throw;
    }
    return summary;
}

}  // namespace qk::nn
