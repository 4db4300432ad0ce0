#include "nn/train/eval_protocol.h"

#include <algorithm>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/distributed.h"
#include "core/factory.h"

namespace qk::nn {

double nanogpt_val_loss(GPT& model, const TextDataset& data) {
    const int64_t W = kNanoGptWindow;
    QK_CHECK(model.config().block_size >= W,
             "eval protocol nanogpt: windows of {} tokens, but the model attends {} at most "
             "(block_size); train with a block size of {} or more",
             W, model.config().block_size, W);
    const TokenSequence& val = data.tokens(/*train=*/false);
    const int64_t windows = (val.size() - 1) / W;  // tokens [W·k, W·k + W + 1)
    QK_CHECK(windows > 0,
             "eval protocol nanogpt: the validation split holds {} tokens, fewer than one window "
             "of {} + 1",
             val.size(), W);
    NoGradGuard no_grad;
    model.eval();
    constexpr int64_t kBatch = 8;  // windows per forward
    double loss_sum = 0;           // Σ over this rank's windows of their mean loss
    std::vector<int32_t> tokens(static_cast<size_t>(W + 1)), ids, targets;
    for (int64_t first = 0; first < windows; first += kBatch) {
        ids.clear(), targets.clear();
        int64_t rows = 0;
        for (int64_t k = first; k < std::min(first + kBatch, windows); ++k) {
            if (k % dist::world_size() != dist::rank()) continue;
            val.read(k * W, W + 1, tokens.data());
            ids.insert(ids.end(), tokens.begin(), tokens.end() - 1);
            targets.insert(targets.end(), tokens.begin() + 1, tokens.end());
            ++rows;
        }
        if (rows == 0) continue;
        const Tensor x = from_ids(ids, {rows, W}).to(model.device());
        const Tensor y = from_ids(targets, {rows, W}).to(model.device());
        loss_sum += model.forward(x, y).cross_entropy.item() * static_cast<double>(rows);
    }
    model.train();
    return dist::all_reduce_sum(loss_sum) / static_cast<double>(windows);
}

}  // namespace qk::nn
