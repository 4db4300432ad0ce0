// Token files: llm.c's shards and nanoGPT's train.bin/val.bin, written and memory-mapped.
//
// llm.c's layout: a header of 256 little-endian int32 — [0] the magic, [1] the version, [2] the
// number of tokens — then the tokens. Magic 20240520 with version 1 holds uint16 tokens (GPT-2's
// 50,257 ids fit); magic 20240801 with version 7 holds uint32 tokens (larger vocabularies).
// nanoGPT's prepare.py writes raw uint16 tokens with no header, as train.bin and val.bin.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace qk::nn {

inline constexpr int32_t kShardMagic16 = 20240520, kShardVersion16 = 1;
inline constexpr int32_t kShardMagic32 = 20240801, kShardVersion32 = 7;
inline constexpr int64_t kShardHeaderBytes = 256 * 4;

// Writes tokens as an llm.c shard, uint16 (token_bytes 2) or uint32 (4), atomically.
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       int token_bytes);

// A sequence of token ids: in memory, or token files memory-mapped and read in order as one
// stream (pages are read from disk as windows touch them; nothing is kept loaded). Opening a file
// reads it once, in order, to check that every id is below vocab_size.
class TokenSequence {
  public:
    virtual ~TokenSequence() = default;
    virtual int64_t size() const = 0;
    // Tokens [start, start + n) into out; throws on an id at or past the vocabulary's size,
    // naming the file and the position.
    virtual void read(int64_t start, int64_t n, int32_t* out) const = 0;
    // Where a position lies, for messages: "shard.bin, token 123".
    virtual std::string where(int64_t position) const = 0;
};

std::shared_ptr<const TokenSequence> tokens_in_memory(std::vector<int32_t> tokens);
// Each file an llm.c shard (by its magic) or, named train.bin / val.bin, nanoGPT's raw uint16.
// A wrong magic or version, a truncated header, a count that disagrees with the file's size, an
// empty file: a qk::Error naming the file.
std::shared_ptr<const TokenSequence> map_token_files(const std::vector<std::string>& paths,
                                                     int64_t vocab_size);

// The token files of a directory, sorted by name: the .bin files whose names hold "train" and
// those whose names hold "val" (llm.c's NAME_train_000001.bin, nanoGPT's train.bin).
struct TokenFiles {
    std::vector<std::string> train, val;
};
TokenFiles find_token_files(const std::string& dir);

}  // namespace qk::nn
