// Text data: a dataset of seeded random windows (tokenizers: nn/text/tokenizer.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/text/shards.h"
#include "nn/text/tokenizer.h"

namespace qk::nn {

// Token ids for training and validation, and batches of random windows of block_size + 1
// tokens from them (nanoGPT's sampler): a window can start at any token, so the sampler's whole
// state is its generator's, which checkpoints save.
class TextDataset {
  public:
    // In memory: the first train_fraction of the tokens to train on, the rest to validate.
    TextDataset(const std::vector<int32_t>& tokens, int64_t block_size,
                double train_fraction = 0.9);
    // Two sequences, e.g. memory-mapped token shards (nn/text/shards.h).
    TextDataset(std::shared_ptr<const TokenSequence> train,
                std::shared_ptr<const TokenSequence> val, int64_t block_size);

    // A batch of B windows: ids (B, T) and targets (B, T) = ids shifted by one, int32. Every
    // window start is drawn from gen, whatever reads_row says, so the stream is the same for any
    // number of ranks; only the rows reads_row accepts (all, if it is empty) are read from the
    // tokens, the others are left 0: each rank of a data-parallel run reads its own part.
    void batch(bool train, int64_t batch_size, Generator& gen, Tensor& ids, Tensor& targets,
               const std::function<bool(int64_t row)>& reads_row = {}) const;
    int64_t train_tokens() const { return train_->size(); }
    int64_t val_tokens() const { return val_->size(); }
    const TokenSequence& tokens(bool train) const { return train ? *train_ : *val_; }

  private:
    void check_sizes() const;
    std::shared_ptr<const TokenSequence> train_, val_;
    int64_t block_size_;
};

// The text of a regular, non-empty file of at most kMaxTextFileBytes, or a qk::Error naming
// `what` and the path: "data: 'x/' is a directory, not a regular file", "data: 'x' is empty".
// The cap keeps a corpus within what its int32 token ids (4 bytes a character) leave of memory.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{2} << 30;
std::string read_text_file(const std::string& path, const std::string& what = "read_text_file");

}  // namespace qk::nn
