// A corpus as token shards in llm.c's format (nn/text/shards.h): `qknorm prepare`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/text/tokenizer.h"

namespace qk::nn {

struct PrepareOptions {
    std::string out_dir;
    std::string name = "data";  // files NAME_val_000000.bin, NAME_train_000001.bin, ...
    // The last fraction of the input bytes is the validation split (cut inside a text file at
    // exactly that byte, between documents inside a JSONL file), as `qknorm train --data FILE`
    // cuts a text file: the two see the same validation text.
    double val_fraction = 0.1;
    int64_t shard_tokens = 100'000'000;  // tokens per train shard, as llm.c's fineweb.py
    std::string text_field = "text";     // the field of each JSONL line that holds a document
    std::function<void(int64_t done_bytes, int64_t total_bytes)> progress;
};

struct PrepareSummary {
    int64_t train_tokens = 0, val_tokens = 0, documents = 0;
    int64_t train_bytes = 0, val_bytes = 0;  // of text
    int token_bytes = 2;                     // uint16 (vocabulary <= 65,536) or uint32
    std::vector<std::string> files;
};

// Inputs: text files (one document each), JSONL files (.jsonl: one document per line), or
// directories (their .txt, .md and .jsonl files, recursively, in name order). Each document is
// encoded as ordinary text (a literal "<|endoftext|>" in it is text) and preceded by the
// tokenizer's document separator when it has one (<|endoftext|>, as llm.c's scripts do).
PrepareSummary prepare_token_shards(const Tokenizer& tokenizer,
                                    const std::vector<std::string>& inputs,
                                    const PrepareOptions& options);

}  // namespace qk::nn
