#include "nn/text/data.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/error.h"
#include "core/factory.h"
#include "core/file_io.h"

namespace qk::nn {

TextDataset::TextDataset(const std::vector<int32_t>& tokens, int64_t block_size,
                         double train_fraction)
    : block_size_(block_size) {
    const auto split = static_cast<int64_t>(static_cast<double>(tokens.size()) * train_fraction);
    train_ = tokens_in_memory({tokens.begin(), tokens.begin() + split});
    val_ = tokens_in_memory({tokens.begin() + split, tokens.end()});
    check_sizes();
}

TextDataset::TextDataset(std::shared_ptr<const TokenSequence> train,
                         std::shared_ptr<const TokenSequence> val, int64_t block_size)
    : train_(std::move(train)), val_(std::move(val)), block_size_(block_size) {
    check_sizes();
}

void TextDataset::check_sizes() const {
    QK_CHECK(val_->size() > block_size_ + 1 && train_->size() > block_size_ + 1,
             "TextDataset: {} train and {} val tokens; each needs more than block_size + 1 = {}",
             train_->size(), val_->size(), block_size_ + 1);
}

void TextDataset::batch(bool train, int64_t batch_size, Generator& gen, Tensor& ids,
                        Tensor& targets, const std::function<bool(int64_t)>& reads_row) const {
    const TokenSequence& src = train ? *train_ : *val_;
    const int64_t T = block_size_;
    ids = zeros({batch_size, T}, kI32);
    targets = zeros({batch_size, T}, kI32);
    int32_t* x = ids.data<int32_t>();
    int32_t* y = targets.data<int32_t>();
    const auto starts = static_cast<uint64_t>(src.size() - T - 1);  // the last leaves a target
    std::vector<int32_t> window(static_cast<size_t>(T + 1));
    for (int64_t b = 0; b < batch_size; ++b) {
        const auto start = static_cast<int64_t>(gen.uniform() * static_cast<double>(starts + 1));
        if (reads_row && !reads_row(b)) continue;
        src.read(start, T + 1, window.data());
        std::copy_n(window.begin(), T, x + b * T);
        std::copy_n(window.begin() + 1, T, y + b * T);
    }
}

std::string read_text_file(const std::string& path, const std::string& what) {
    std::string text = read_regular_file(path, what, kMaxTextFileBytes);
    QK_CHECK(!text.empty(), "{}: '{}' is empty", what, path);
    return text;
}

}  // namespace qk::nn
