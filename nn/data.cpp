#include "nn/data.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/error.h"
#include "core/file_io.h"

namespace qk::nn {

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
