#include "nn/data.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/error.h"
#include "core/file_io.h"

namespace qk::nn {

Tokenizer Tokenizer::char_level(const std::string& text) {
    QK_CHECK(!text.empty(), "Tokenizer: cannot build a char-level vocabulary from empty text");
    std::vector<bool> seen(256, false);
    for (unsigned char c : text) seen[c] = true;
    Tokenizer t;
    for (int c = 0; c < 256; ++c)
        if (seen[c]) t.vocab_.push_back(static_cast<char>(c));
    t.lookup_.assign(256, -1);
    for (size_t i = 0; i < t.vocab_.size(); ++i)
        t.lookup_[static_cast<unsigned char>(t.vocab_[i])] = int32_t(i);
    return t;
}

Tokenizer Tokenizer::byte_level() {
    Tokenizer t;
    for (int c = 0; c < 256; ++c) t.vocab_.push_back(static_cast<char>(c));
    t.lookup_.resize(256);
    for (int c = 0; c < 256; ++c) t.lookup_[c] = c;
    t.byte_level_ = true;
    return t;
}

std::string Tokenizer::serialize() const {
    if (byte_level_) return "bytes";
    std::string out = "chars:";
    for (unsigned char c : vocab_) out += fmt::format("{:02x}", c);
    return out;
}

Tokenizer Tokenizer::deserialize(const std::string& s) {
    if (s == "bytes") return byte_level();
    QK_CHECK(s.rfind("chars:", 0) == 0 && s.size() % 2 == 0 && s.size() > 6,
             "Tokenizer: cannot read '{}' (expected 'bytes' or 'chars:' + hex bytes)",
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
    QK_CHECK(t.vocab_ == vocab, "Tokenizer: the vocabulary in '{}' is not sorted unique bytes",
             s.substr(0, 40));
    return t;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        const int32_t id = lookup_[static_cast<unsigned char>(text[i])];
        QK_CHECK(id >= 0,
                 "Tokenizer: character '{}' (byte {}) at position {} is not in the vocabulary "
                 "of {} characters",
                 std::string(1, text[i]), static_cast<unsigned char>(text[i]), i, vocab_.size());
        ids.push_back(id);
    }
    return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) {
        QK_CHECK(id >= 0 && id < vocab_size(), "Tokenizer: id {} is outside the vocabulary [0, {})",
                 id, vocab_size());
        out.push_back(vocab_[id]);
    }
    return out;
}

TextDataset::TextDataset(const std::vector<int32_t>& tokens, int64_t block_size,
                         double train_fraction)
    : block_size_(block_size) {
    const size_t split = static_cast<size_t>(static_cast<double>(tokens.size()) * train_fraction);
    train_.assign(tokens.begin(), tokens.begin() + split);
    val_.assign(tokens.begin() + split, tokens.end());
    QK_CHECK(static_cast<int64_t>(val_.size()) > block_size + 1 &&
                 static_cast<int64_t>(train_.size()) > block_size + 1,
             "TextDataset: {} tokens give {} train and {} val tokens; each needs more than "
             "block_size + 1 = {}",
             tokens.size(), train_.size(), val_.size(), block_size + 1);
}

void TextDataset::batch(bool train, int64_t batch_size, Generator& gen, Tensor& ids,
                        Tensor& targets) const {
    const std::vector<int32_t>& src = train ? train_ : val_;
    const int64_t T = block_size_;
    ids = Tensor::empty({batch_size, T}, kI32);
    targets = Tensor::empty({batch_size, T}, kI32);
    int32_t* x = ids.data<int32_t>();
    int32_t* y = targets.data<int32_t>();
    const uint64_t starts = src.size() - static_cast<size_t>(T) - 1;  // last start leaves a target
    for (int64_t b = 0; b < batch_size; ++b) {
        const uint64_t start =
            static_cast<uint64_t>(gen.uniform() * static_cast<double>(starts + 1));
        std::copy_n(src.begin() + static_cast<int64_t>(start), T, x + b * T);
        std::copy_n(src.begin() + static_cast<int64_t>(start) + 1, T, y + b * T);
    }
}

std::string read_text_file(const std::string& path, const std::string& what) {
    std::string text = read_regular_file(path, what, kMaxTextFileBytes);
    QK_CHECK(!text.empty(), "{}: '{}' is empty", what, path);
    return text;
}

}  // namespace qk::nn
