// Text data: tokenizers and a dataset of seeded random windows.
#pragma once

#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace qk::nn {

// Char-level (the sorted unique bytes of a text) or byte-level (all 256 bytes) tokenizer.
class Tokenizer {
  public:
    static Tokenizer char_level(const std::string& text);
    static Tokenizer byte_level();
    // The string form saved in checkpoints: "bytes" or "chars:" + the vocabulary, hex-encoded.
    std::string serialize() const;
    static Tokenizer deserialize(const std::string& s);

    std::vector<int32_t> encode(const std::string& text) const;  // throws on an unknown character
    std::string decode(const std::vector<int32_t>& ids) const;
    int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
    bool is_byte_level() const { return byte_level_; }

  private:
    std::string vocab_;            // id -> byte
    std::vector<int32_t> lookup_;  // byte -> id, or -1
    bool byte_level_ = false;
};

// Token ids split 90 % train / 10 % val; random windows of block_size + 1 tokens.
class TextDataset {
  public:
    TextDataset(const std::vector<int32_t>& tokens, int64_t block_size,
                double train_fraction = 0.9);

    // A batch of B windows: ids (B, T) and targets (B, T) = ids shifted by one, int32.
    // Window starts are drawn from gen, so the sampler's whole state is the generator's.
    void batch(bool train, int64_t batch_size, Generator& gen, Tensor& ids, Tensor& targets) const;
    int64_t train_tokens() const { return static_cast<int64_t>(train_.size()); }
    int64_t val_tokens() const { return static_cast<int64_t>(val_.size()); }

  private:
    std::vector<int32_t> train_, val_;
    int64_t block_size_;
};

// The text of a regular, non-empty file of at most kMaxTextFileBytes, or a qk::Error naming
// `what` and the path: "data: 'x/' is a directory, not a regular file", "data: 'x' is empty".
// The cap keeps a corpus within what its int32 token ids (4 bytes a character) leave of memory.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{2} << 30;
std::string read_text_file(const std::string& path, const std::string& what = "read_text_file");

}  // namespace qk::nn
