// The KV cache: the keys and values a model has already computed, per layer and per sequence, so
// that one more token costs one position's work instead of the whole context's
// (docs/generation.md).
//
// What is cached is what enters the dot product: k after the QK-norm and RoPE (in the order the
// config gives), v after its norm with qkv_norm. Nothing is recomputed, and nothing depends on
// how the tokens arrived: a prompt prefilled at once, in chunks, or one token at a time leaves the
// same numbers in the cache.
//
//   full layers     a buffer of `capacity` positions per sequence; position p sits in slot p.
//   sliding layers  a ring of `window` slots (Gemma 3's local layers, Mistral): position p sits
//                   in slot p mod window, overwriting the key that left the window.
//
// Each sequence of a batch has its own length: several prompts of different lengths decode
// together, their GEMMs batched, their attention each over its own keys.
#pragma once

#include <utility>
#include <vector>

#include "nn/model/config.h"

namespace qk::nn {

class KVCache {
  public:
    // For `batch` sequences of up to `capacity` positions each (<= config.block_size), in the
    // model's dtype and on its device.
    KVCache(const GPTConfig& config, int64_t batch, int64_t capacity, DType dtype = kF32,
            Device device = Device::cpu);

    int64_t batch() const { return static_cast<int64_t>(lengths_.size()); }
    int64_t capacity() const { return capacity_; }
    int64_t length(int64_t sequence) const;  // positions cached so far
    // The longest run of new positions sequence `s` can still take.
    int64_t room(int64_t sequence) const { return capacity_ - length(sequence); }

    // Layer `layer` of sequence `s` receives the k and v of its next T positions, (1, Hkv, T, D),
    // and returns the keys and values those T queries see, in position order, (1, Hkv, Tk, D):
    // every cached position and the new ones on a full layer; on a sliding layer the window's
    // (the ring unrolled, then the new ones), which the caller masks with the layer's window and
    // the causal offset Tk − T. The positions count once every layer is done: advance().
    std::pair<Tensor, Tensor> append(int64_t layer, int64_t sequence, const Tensor& k,
                                     const Tensor& v);
    // Sequence `s` now holds `n` more positions (after every layer appended them).
    void advance(int64_t sequence, int64_t n);
    // Forgets sequence `s` (length 0), keeping its buffers.
    void reset(int64_t sequence);

    // The bytes of keys and values held for sequence `s`: what a decode step reads.
    int64_t bytes_in_use(int64_t sequence) const;

  private:
    struct Slots {
        Tensor k, v;         // (1, Hkv, slots, D)
        int64_t window = 0;  // 0: a full layer (slots = capacity); else a ring of `window` slots
    };
    std::vector<std::vector<Slots>> layers_;  // [layer][sequence]
    std::vector<int64_t> lengths_;
    int64_t capacity_;
    int64_t kv_heads_, head_dim_, element_size_;
};

}  // namespace qk::nn
