#include "nn/text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "nn/model/checkpoint_files.h"
#include "nn/text/bpe.h"
#include "nn/text/modality.h"
#include "nn/text/sentencepiece.h"

namespace qk::nn {

namespace fs = std::filesystem;

namespace {

// ---- chars and bytes ----------------------------------------------------------------------------

// One id per byte of `alphabet` (sorted unique bytes); all 256 for the byte-level kind.
class ByteAlphabet final : public TokenizerModel {
  public:
    ByteAlphabet(std::string alphabet, bool all_bytes)
        : alphabet_(std::move(alphabet)), all_bytes_(all_bytes) {
        lookup_.fill(-1);
        for (size_t i = 0; i < alphabet_.size(); ++i)
            lookup_[static_cast<unsigned char>(alphabet_[i])] = static_cast<int32_t>(i);
    }

    std::vector<int32_t> encode(std::string_view text, bool) const override {
        std::vector<int32_t> ids;
        ids.reserve(text.size());
        for (size_t i = 0; i < text.size(); ++i) {
            const int32_t id = lookup_[static_cast<unsigned char>(text[i])];
            QK_CHECK(id >= 0,
                     "Tokenizer: character '{}' (byte {}) at position {} is not in the "
                     "vocabulary of {} characters",
                     std::string(1, text[i]), static_cast<unsigned char>(text[i]), i,
                     alphabet_.size());
            ids.push_back(id);
        }
        return ids;
    }
    std::string decode(const std::vector<int32_t>& ids) const override {
        std::string out;
        out.reserve(ids.size());
        for (int32_t id : ids) {
            QK_CHECK(id >= 0 && id < vocab_size(),
                     "Tokenizer: id {} is outside the vocabulary [0, {})", id, vocab_size());
            out.push_back(alphabet_[static_cast<size_t>(id)]);
        }
        return out;
    }
    int64_t vocab_size() const override { return static_cast<int64_t>(alphabet_.size()); }
    std::string kind() const override { return all_bytes_ ? "bytes" : "chars"; }
    const std::string& alphabet() const { return alphabet_; }

  private:
    std::string alphabet_;  // id -> byte
    std::array<int32_t, 256> lookup_{};
    bool all_bytes_;
};

// ---- base64, for a SentencePiece model inside a checkpoint's (string) metadata -----------------

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string to_base64(const std::string& bytes) {
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
        uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
        if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
        if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
        for (size_t k = 0; k < 4; ++k)
            out += i + k <= bytes.size() ? kBase64[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
}

std::string from_base64(std::string_view text) {
    QK_CHECK(text.size() % 4 == 0, "Tokenizer: base64 text of length {} (not a multiple of 4)",
             text.size());
    std::string out;
    for (size_t i = 0; i < text.size(); i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = text[i + k];
            const char* at = c == '=' ? nullptr : std::strchr(kBase64, c);
            QK_CHECK(c == '=' ? i + 4 == text.size() && k >= 2 : at != nullptr && c != '\0',
                     "Tokenizer: bad base64 at {}", i + k);
            pad += c == '=';
            v = (v << 6) | static_cast<uint32_t>(at ? at - kBase64 : 0);
        }
        for (int k = 0; k < 3 - pad; ++k) out += static_cast<char>((v >> (16 - 8 * k)) & 0xff);
    }
    return out;
}

constexpr uint64_t kMaxTokenizerFile = uint64_t{256} << 20;

Tokenizer bpe_from_json(const std::string& text, const std::string& source) {
    const JsonExtent extent = measure_json(text);
    QK_CHECK(extent.max_depth <= 64 && extent.elements <= (uint64_t{64} << 20),
             "tokenizer {}: JSON nested {} deep with {} elements is past what a tokenizer.json "
             "holds",
             source, extent.max_depth, extent.elements);
    return Tokenizer(std::make_shared<bpe::BpeTokenizer>(bpe::parse_tokenizer_json(text, source)));
}

// The "tokenizer" entry of a qknorm checkpoint's metadata, reading its header only.
std::string checkpoint_tokenizer(const std::string& path) {
    const auto metadata = read_safetensors_metadata(path);
    const auto it = metadata.find("tokenizer");
    QK_CHECK(it != metadata.end(),
             "tokenizer {}: a safetensors file without a tokenizer in its __metadata__ (not a "
             "qknorm checkpoint)",
             path);
    return it->second;
}

}  // namespace

Tokenizer Tokenizer::char_level(const std::string& text) {
    QK_CHECK(!text.empty(), "Tokenizer: cannot build a char-level vocabulary from empty text");
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    std::string alphabet;
    for (int c = 0; c < 256; ++c)
        if (seen[static_cast<size_t>(c)]) alphabet.push_back(static_cast<char>(c));
    return Tokenizer(std::make_shared<ByteAlphabet>(alphabet, false));
}

Tokenizer Tokenizer::byte_level() {
    std::string alphabet;
    for (int c = 0; c < 256; ++c) alphabet.push_back(static_cast<char>(c));
    return Tokenizer(std::make_shared<ByteAlphabet>(alphabet, true));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
    if (fs::is_directory(path)) {
        if (const std::string file = tokenizer_file_in(path); !file.empty()) return from_file(file);
        // A run directory: the tokenizer of its latest checkpoint.
        if (const std::string checkpoint = latest_model_checkpoint(path); !checkpoint.empty())
            return from_file(checkpoint);
        throw Error(
            fmt::format("tokenizer: directory '{}' holds no tokenizer.json, "
                        "tokenizer.model or checkpoint",
                        path));
    }
    if (fs::path(path).extension() == ".safetensors")
        return deserialize(checkpoint_tokenizer(path));
    const std::string bytes = read_regular_file(path, "tokenizer", kMaxTokenizerFile);
    QK_CHECK(!bytes.empty(), "tokenizer: '{}' is empty", path);
    const size_t first = bytes.find_first_not_of(" \t\r\n");
    if (fs::path(path).extension() == ".json" ||
        (first != std::string::npos && (bytes[first] == '{' || bytes[first] == '[')))
        return bpe_from_json(bytes, path);
    if (fs::path(path).extension() == ".model") return Tokenizer(load_sentencepiece(bytes, path));
    throw Error(
        fmt::format("tokenizer: '{}' is neither a tokenizer.json (JSON) nor a "
                    "SentencePiece tokenizer.model",
                    path));
}

namespace {

// How many leading bytes of s end on a character boundary with nothing that may still change: an
// incomplete UTF-8 sequence at the end, and U+FFFD characters at the end, are left out.
size_t complete_prefix(std::string_view s) {
    size_t end = s.size();
    // An incomplete sequence: a lead byte within the last 3 bytes whose sequence runs past the end.
    for (size_t back = 1; back <= 3 && back <= end; ++back) {
        const auto c = static_cast<unsigned char>(s[end - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back) end -= back;
        break;
    }
    constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    while (end >= kReplacement.size() &&
           s.substr(end - kReplacement.size(), kReplacement.size()) == kReplacement)
        end -= kReplacement.size();
    return end;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, std::vector<int32_t> context)
    : tokenizer_(tokenizer), ids_(std::move(context)) {
    shown_ = ids_.empty() ? std::string() : tokenizer_.decode(ids_);
}

std::string StreamDecoder::push(int32_t id) {
    ids_.push_back(id);
    const std::string all = tokenizer_.decode(ids_);
    // Decoding more ids only appends to the text before it; where a tokenizer would rewrite it,
    // nothing more is shown until finish().
    if (all.compare(0, shown_.size(), shown_) != 0) return {};
    const std::string_view fresh = std::string_view(all).substr(shown_.size());
    const std::string piece(fresh.substr(0, complete_prefix(fresh)));
    shown_ += piece;
    text_ += piece;
    return piece;
}

std::string StreamDecoder::finish() {
    const std::string all = tokenizer_.decode(ids_);
    std::string rest = all.size() > shown_.size() && all.compare(0, shown_.size(), shown_) == 0
                           ? all.substr(shown_.size())
                           : std::string();
    shown_ += rest;
    text_ += rest;
    return rest;
}

std::string tokenizer_file_in(const std::string& dir) {
    for (const char* name : {"tokenizer.json", "tokenizer.model"})
        if (fs::exists(fs::path(dir) / name)) return (fs::path(dir) / name).string();
    return "";
}

Tokenizer Tokenizer::from_flag(const std::string& flag, const std::string& text) {
    if (flag == "char") return char_level(text);
    if (flag == "byte") return byte_level();
    return from_file(flag);
}

std::string Tokenizer::serialize() const {
    const std::string k = kind();
    if (k == "bytes") return "bytes";
    if (k == "bpe") return "bpe:" + model_->file_contents();
    if (k == "sentencepiece") return "sentencepiece:" + to_base64(model_->file_contents());
    if (k == "mixed") return serialize_mixed(*this);
    std::string out = "chars:";
    for (unsigned char c : static_cast<const ByteAlphabet&>(*model_).alphabet())
        out += fmt::format("{:02x}", c);
    return out;
}

Tokenizer Tokenizer::deserialize(const std::string& s) {
    if (s == "bytes") return byte_level();
    if (s.rfind("bpe:", 0) == 0) return bpe_from_json(s.substr(4), "(checkpoint)");
    if (s.rfind("mixed:", 0) == 0) return deserialize_mixed(s);
    if (s.rfind("sentencepiece:", 0) == 0)
        return Tokenizer(
            load_sentencepiece(from_base64(std::string_view(s).substr(14)), "(checkpoint)"));
    QK_CHECK(s.rfind("chars:", 0) == 0 && s.size() % 2 == 0 && s.size() > 6,
             "Tokenizer: cannot read '{}' (expected 'bytes', 'chars:' + hex bytes, 'bpe:' + "
             "tokenizer.json, 'sentencepiece:' + base64 or 'mixed:' + codes + ':' + one of "
             "these)",
             s.substr(0, 40));
    std::string vocab;
    for (size_t i = 6; i < s.size(); i += 2) {
        unsigned value = 0;
        // isxdigit first: sscanf alone would accept " a", "+a" or "0x" as hex.
        QK_CHECK(std::isxdigit(static_cast<unsigned char>(s[i])) &&
                     std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
                     std::sscanf(s.c_str() + i, "%2x", &value) == 1,
                 "Tokenizer: bad hex at {} in '{}'", i, s.substr(0, 40));
        vocab.push_back(static_cast<char>(value));
    }
    // Ids are positions in the vocabulary: a reordered or repeated one would silently remap them.
    Tokenizer t = char_level(vocab);
    QK_CHECK(static_cast<const ByteAlphabet&>(*t.model_).alphabet() == vocab,
             "Tokenizer: the vocabulary in '{}' is not sorted unique bytes", s.substr(0, 40));
    return t;
}

void Tokenizer::save(const std::string& path) const {
    const std::string contents = model_->file_contents();
    QK_CHECK(!contents.empty(), "Tokenizer: a {} tokenizer has no file form to save to '{}'",
             kind(), path);
    write_file_atomic(path, contents);
}

}  // namespace qk::nn
