#include "nn/model/kv_cache.h"

#include <algorithm>

#include "core/error.h"
#include "core/factory.h"
#include "ops/join.h"

namespace qk::nn {

namespace {

// The `count` positions ending before `end`, of a ring of t.size(2) slots, in position order:
// one narrow of t, or two joined when they wrap around its end.
Tensor unroll(const Tensor& t, int64_t end, int64_t count) {
    const int64_t slots = t.size(2), start = (end - count) % slots;
    if (start + count <= slots) return t.narrow(2, start, count);
    return cat({t.narrow(2, start, slots - start), t.narrow(2, 0, count - (slots - start))}, 2);
}

// Writes the last min(T, slots) of `values` (1, Hkv, T, D), positions first..first+T−1, into
// their slots (position p in slot p mod slots): at most two contiguous pieces.
void store(const Tensor& ring, const Tensor& values, int64_t first) {
    const int64_t slots = ring.size(2), T = values.size(2);
    const int64_t kept = std::min(T, slots), from = T - kept;  // older ones would be overwritten
    const int64_t slot = (first + from) % slots, head = std::min(kept, slots - slot);
    copy_into(ring.narrow(2, slot, head), values.narrow(2, from, head));
    if (head < kept)
        copy_into(ring.narrow(2, 0, kept - head), values.narrow(2, from + head, kept - head));
}

}  // namespace

KVCache::KVCache(const GPTConfig& config, int64_t batch, int64_t capacity, DType dtype,
                 Device device)
    : lengths_(static_cast<size_t>(std::max<int64_t>(batch, 0)), 0),
      capacity_(capacity),
      kv_heads_(config.kv_heads()),
      head_dim_(config.head_dim()),
      element_size_(static_cast<int64_t>(dtype_size(dtype))) {
    QK_CHECK(batch >= 1, "KVCache: batch must be >= 1, got {}", batch);
    QK_CHECK(capacity >= 1 && capacity <= config.block_size,
             "KVCache: capacity must be in [1, block_size {}], got {}", config.block_size,
             capacity);
    layers_.resize(static_cast<size_t>(config.n_layer));
    for (int64_t layer = 0; layer < config.n_layer; ++layer) {
        const int64_t window = config.is_sliding(layer) ? config.sliding_window : 0;
        // A window as long as the cache never wraps: a plain buffer, masked by the window.
        const int64_t slots = window > 0 ? std::min(window, capacity) : capacity;
        for (int64_t s = 0; s < batch; ++s)
            layers_[static_cast<size_t>(layer)].push_back(
                {zeros({1, kv_heads_, slots, head_dim_}, dtype, device),
                 zeros({1, kv_heads_, slots, head_dim_}, dtype, device), window});
    }
}

int64_t KVCache::length(int64_t sequence) const {
    QK_CHECK(sequence >= 0 && sequence < batch(), "KVCache: sequence {} of a batch of {}", sequence,
             batch());
    return lengths_[static_cast<size_t>(sequence)];
}

std::pair<Tensor, Tensor> KVCache::append(int64_t layer, int64_t sequence, const Tensor& k,
                                          const Tensor& v) {
    const int64_t length = this->length(sequence);
    QK_CHECK(layer >= 0 && layer < static_cast<int64_t>(layers_.size()),
             "KVCache: layer {} of a {}-layer cache", layer, layers_.size());
    const Shape expected{1, kv_heads_, k.dim() == 4 ? k.size(2) : -1, head_dim_};
    QK_CHECK(k.shape() == expected && v.shape() == expected,
             "KVCache: k and v must be (1, {}, T, {}), got {} and {}", kv_heads_, head_dim_,
             k.shape(), v.shape());
    const int64_t T = k.size(2);
    QK_CHECK(length + T <= capacity_,
             "KVCache: sequence {} holds {} of {} positions, {} more do not fit", sequence, length,
             capacity_, T);
    const Slots& slots = layers_[static_cast<size_t>(layer)][static_cast<size_t>(sequence)];
    const int64_t ring = slots.k.size(2);
    if (ring == capacity_) {  // positions are slots: write, then read them all
        copy_into(slots.k.narrow(2, length, T), k);
        copy_into(slots.v.narrow(2, length, T), v);
        return {slots.k.narrow(2, 0, length + T), slots.v.narrow(2, 0, length + T)};
    }
    // A ring: what the window still holds, in position order, joined with the new keys (read
    // before the write, which may overwrite keys the first new queries still see).
    const int64_t past = std::min(length, ring);
    std::pair<Tensor, Tensor> visible{k, v};
    if (past > 0)
        visible = {cat({unroll(slots.k, length, past), k}, 2),
                   cat({unroll(slots.v, length, past), v}, 2)};
    store(slots.k, k, length);
    store(slots.v, v, length);
    return visible;
}

void KVCache::advance(int64_t sequence, int64_t n) {
    QK_CHECK(n >= 0 && length(sequence) + n <= capacity_,
             "KVCache: sequence {} cannot advance by {} from {} of {}", sequence, n,
             length(sequence), capacity_);
    lengths_[static_cast<size_t>(sequence)] += n;
}

void KVCache::reset(int64_t sequence) {
    length(sequence);  // checks the index
    lengths_[static_cast<size_t>(sequence)] = 0;
}

int64_t KVCache::bytes_in_use(int64_t sequence) const {
    const int64_t length = this->length(sequence);
    int64_t positions = 0;
    for (const auto& layer : layers_)
        positions += std::min(length, layer[static_cast<size_t>(sequence)].k.size(2));
    return 2 * positions * kv_heads_ * head_dim_ * element_size_;
}

}  // namespace qk::nn
