// Text data: a dataset of seeded random windows (tokenizers: nn/tokenizer.h).
#pragma once

#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/tokenizer.h"

namespace qk::nn {

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
