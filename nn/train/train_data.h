// What a training run reads: its tokenizer and its dataset, from a text file or from a directory
// of token shards (nn/text/shards.h), and the raw-text bytes per validation token that turn a loss
// in nats per token into bits per byte (docs/tokenizers.md#bits-per-byte).
#pragma once

#include <memory>
#include <string>

#include "nn/text/data.h"
#include "nn/text/modality.h"
#include "nn/train/train_config.h"

namespace qk::nn {

struct TrainingData {
    Tokenizer tokenizer = Tokenizer::byte_level();
    std::unique_ptr<TextDataset> dataset;
    // Bytes of raw text per validation token: 1 for chars and bytes; for BPE, measured by
    // decoding the validation tokens (the first 4 M of them when there are more).
    double val_bytes_per_token = 1;
    // What the ranks of a data-parallel run compare: the data's size and a hash of its content.
    std::string fingerprint;
    // A mixed text + image stream (cfg.multimodal()): its vocabulary (text_vocab 0 otherwise)
    // and what its training part holds, measured.
    ModalityVocab modalities;
    MixedStream::Summary train_mix;

    // A validation loss in nats per token as bits per byte of raw text.
    double bits_per_byte(double nats_per_token) const;
};

// cfg.data_path: a text file (split at 90 % of its bytes: train before, validation after, each
// encoded on its own), or a directory of token files with cfg.tokenizer naming their tokenizer.
// cfg.tokenizer: "char", "byte", or a tokenizer file (Tokenizer::from_file). With
// cfg.multimodal(), each side's text tokens are mixed with images (mix_modalities: the training
// images from one seed, the validation images from another) and the tokenizer is
// mixed_tokenizer's.
TrainingData load_training_data(const TrainConfig& cfg);

}  // namespace qk::nn
