// Tokenizers: text to token ids and back. Four kinds behind one value type:
//   chars          the sorted unique bytes of a text, one id each (the default Tiny Shakespeare
//   run) bytes          the 256 bytes bpe            byte-level BPE, from a Hugging Face
//   tokenizer.json (GPT-2, Qwen2/3, OLMo 2) or
//                  trained here (train_bpe); docs/tokenizers.md explains the merge rule
//   sentencepiece  a SentencePiece tokenizer.model (Gemma), through libsentencepiece
// A checkpoint carries its tokenizer in its metadata (serialize / deserialize).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qk::nn {

// What each kind implements.
class TokenizerModel {
  public:
    virtual ~TokenizerModel() = default;
    // parse_special: added and special tokens written in the text ("<|endoftext|>") become their
    // ids, as Hugging Face's encode does; off, they are text like any other (tiktoken's
    // encode_ordinary, what corpus preparation uses).
    virtual std::vector<int32_t> encode(std::string_view text, bool parse_special) const = 0;
    virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
    virtual int64_t vocab_size() const = 0;
    virtual std::string kind() const = 0;
    // The file this tokenizer loads from (tokenizer.json text, tokenizer.model bytes), or "" for
    // the kinds that have none (chars, bytes).
    virtual std::string file_contents() const { return ""; }
    // The id put before each document of a corpus (<|endoftext|> as llm.c and GPT-2 do, or
    // SentencePiece's <bos>), if the tokenizer has one.
    virtual std::optional<int32_t> document_separator() const { return std::nullopt; }
    virtual std::optional<int32_t> token_id(std::string_view) const { return std::nullopt; }
};

class Tokenizer {
  public:
    static Tokenizer char_level(const std::string& text);
    static Tokenizer byte_level();
    // A tokenizer.json (byte-level BPE), a tokenizer.model (SentencePiece), a directory holding
    // one of them (a Hugging Face model), a qknorm checkpoint (.safetensors, its tokenizer), or a
    // run directory (its latest checkpoint's).
    // Anything else, or a file of an unsupported kind, is a qk::Error naming the file and why.
    static Tokenizer from_file(const std::string& path);
    // What --tokenizer takes: "char" (built from `text`), "byte", or a path for from_file.
    static Tokenizer from_flag(const std::string& flag, const std::string& text);

    // The string form saved in checkpoints: "bytes", "chars:" + hex bytes, "bpe:" + the
    // tokenizer.json text, or "sentencepiece:" + the model file in base64.
    std::string serialize() const;
    static Tokenizer deserialize(const std::string& s);
    // Writes file_contents() to `path` atomically (bpe: a tokenizer.json that Hugging Face
    // tokenizers loads as well).
    void save(const std::string& path) const;

    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const {
        return model_->encode(text, parse_special);
    }
    // Throws on an id outside the vocabulary.
    std::string decode(const std::vector<int32_t>& ids) const { return model_->decode(ids); }
    int64_t vocab_size() const { return model_->vocab_size(); }
    std::string kind() const { return model_->kind(); }  // chars, bytes, bpe, sentencepiece, mixed
    bool is_byte_level() const { return kind() == "bytes"; }
    std::optional<int32_t> document_separator() const { return model_->document_separator(); }
    const TokenizerModel& model() const { return *model_; }

    explicit Tokenizer(std::shared_ptr<const TokenizerModel> model) : model_(std::move(model)) {}

  private:
    std::shared_ptr<const TokenizerModel> model_;
};

// Decodes a growing sequence for printing as it grows: each push returns the text the new id
// completes, and only whole characters. A token is not a unit of text: a byte-level BPE or a
// SentencePiece byte-fallback token can hold part of a UTF-8 sequence (decoded alone it is U+FFFD),
// and SentencePiece decodes a leading "▁" as a space only after other text. So the whole sequence,
// context included, is decoded each time, and what follows the text already returned is given
// out up to its last complete character; an incomplete UTF-8 sequence or trailing U+FFFD
// (SentencePiece's stand-in for bytes still to come) waits for the next id or for finish().
class StreamDecoder {
  public:
    // context: ids already shown (a prompt), never returned.
    StreamDecoder(const Tokenizer& tokenizer, std::vector<int32_t> context);
    std::string push(int32_t id);
    std::string finish();                              // whatever was held back
    const std::string& text() const { return text_; }  // all returned so far, context excluded

  private:
    const Tokenizer& tokenizer_;
    std::vector<int32_t> ids_;
    std::string shown_;  // the decoded context and every returned piece
    std::string text_;
};

// A Hugging Face model directory's tokenizer file: its tokenizer.json, else its tokenizer.model,
// else "" (the directory has neither).
std::string tokenizer_file_in(const std::string& dir);

// Byte-level BPE training, as Hugging Face's BpeTrainer with a ByteLevel pre-tokenizer does it
// (the same merges, in the same order): the corpus is cut into words by GPT-2's pre-tokenizer
// regex, and each step merges the most frequent adjacent pair of symbols (counted over every
// occurrence of every word), ties going to the pair of smallest ids. Ids: the special tokens,
// then the 256 bytes (ordered by their stand-in characters, as GPT-2's vocabulary is), then one
// per merge, until vocab_size.
struct BpeTrainOptions {
    int64_t vocab_size = 1024;
    std::vector<std::string> special_tokens{"<|endoftext|>"};
    int64_t min_frequency = 2;  // a pair seen fewer times is not merged (training stops)
    // Called as the corpus is read (phase "read", bytes) and as merges are made ("merge").
    std::function<void(const char* phase, int64_t done, int64_t total)> progress;
};
Tokenizer train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& options);

}  // namespace qk::nn
