// Byte-level BPE (GPT-2, Qwen2/3, OLMo 2, Llama 3): the model behind a Hugging Face
// tokenizer.json of that kind, the merge rule, and the stand-in characters its files use for bytes.
// Internal: users reach it through nn/text/tokenizer.h.
//
// Encoding a text:
//   1. added tokens (<|endoftext|>, <|im_start|>, ...) are cut out first, leftmost-longest;
//   2. each text between them is normalised (NFC for Qwen) and cut into pieces by the
//      pre-tokenizer's regexes (nn/text/pretokenizer.h): words with their leading space, numbers,
//      punctuation runs, white space;
//   3. each piece starts as its bytes, one symbol each, and the merge rule runs on it:
//        while some adjacent pair (a, b) of symbols is in the merge list:
//            replace the pair of lowest rank (the leftmost one among equals) by the symbol ab
//      The ids of the final symbols are the piece's tokens. Pieces never merge across each other,
//      so a piece's tokens depend on the piece alone: they are cached.
// Decoding joins the tokens' bytes: decode(encode(x)) == x for any bytes x.
//
// Files spell each byte as one printable character (GPT-2's bytes_to_unicode): the printable
// Latin-1 bytes ! .. ~, ¡ .. ¬, ® .. ÿ stand for themselves, and the other 68 bytes (controls, the
// space, 0x7f..0xa0, 0xad) for U+0100 onwards in byte order, so "Ġ" (U+0120) is the space. This
// file maps them back at load time: inside, tokens are plain bytes.
#pragma once

#include <array>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "nn/text/pretokenizer.h"
#include "nn/text/tokenizer.h"

namespace qk::nn::bpe {

// The character a tokenizer.json writes for each byte (UTF-8), and the way back.
const std::array<std::string, 256>& byte_stand_ins();
std::string to_stand_ins(std::string_view bytes);
// The bytes a stand-in string means, or nullopt when a character is not a stand-in.
std::optional<std::string> from_stand_ins(std::string_view text);

struct AddedToken {
    std::string content;  // matched in raw text, as is
    int32_t id = 0;
    bool special = false;
    bool lstrip = false, rstrip = false;  // the white space before / after it joins the token
};

// One merge rule: the pair (left, right) of ids becomes `merged`; lower ranks merge first.
struct MergeRule {
    int32_t rank, merged;
};

// What a tokenizer.json says, in the engine's terms (nn/text/bpe_json.cpp reads and writes it).
struct BpeSpec {
    std::vector<std::string> tokens;                  // id -> bytes; "" for an id no token uses
    std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order
    std::vector<AddedToken> added;
    std::vector<Normalization> normalizers;
    std::vector<SplitStep> pre_tokenizer;
    bool add_prefix_space = false;  // a space before each text that does not start with one
    bool ignore_merges = false;     // a piece that is a whole token is that token (Llama 3)
    std::string json;               // the tokenizer.json text, kept to be saved as it came
};

BpeSpec parse_tokenizer_json(const std::string& json_text, const std::string& source);

// A byte-level BPE as a tokenizer.json that Hugging Face tokenizers reads: GPT-2's ByteLevel
// pre-tokenizer (its regex on or off) and decoder. tokens[id] is spelled as in the file (stand-in
// characters; the first `specials` are special tokens, written as they are and listed in
// added_tokens); merges are pairs of such strings, in rank order. The strings must be distinct:
// the file maps each to one id.
std::string byte_level_tokenizer_json(
    const std::vector<std::string>& tokens, size_t specials,
    const std::vector<std::pair<std::string, std::string>>& merges, bool use_regex);

class BpeTokenizer final : public TokenizerModel {
  public:
    explicit BpeTokenizer(BpeSpec spec);

    std::vector<int32_t> encode(std::string_view text, bool parse_special) const override;
    std::string decode(const std::vector<int32_t>& ids) const override;
    int64_t vocab_size() const override { return static_cast<int64_t>(spec_.tokens.size()); }
    std::string kind() const override { return "bpe"; }
    std::string file_contents() const override { return spec_.json; }
    std::optional<int32_t> document_separator() const override;
    std::optional<int32_t> token_id(std::string_view token) const override;

  private:
    // Appends the tokens of one piece of pre-tokenized text.
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
    std::optional<MergeRule> rule(int32_t left, int32_t right) const;

    BpeSpec spec_;
    std::array<int32_t, 256> byte_token_{};                    // the id of each single byte
    std::unordered_map<uint64_t, MergeRule> rules_;            // key: left << 32 | right
    std::unordered_map<std::string_view, int32_t> token_ids_;  // views into spec_.tokens
    std::array<bool, 256> starts_added_{};                     // the first bytes of added tokens

    static constexpr size_t kCacheLimit = 1 << 16;  // pieces; cleared when full
    mutable std::mutex cache_mutex_;
    // Looked up by string_view (a transparent hash): no string is built per piece on a hit.
    struct PieceHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    mutable std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>>
        cache_;
};

}  // namespace qk::nn::bpe
