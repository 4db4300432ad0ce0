#include "nn/text/sentencepiece.h"

#include <sentencepiece_processor.h>

#include "core/error.h"

namespace qk::nn {

namespace {

class SentencePieceTokenizer final : public TokenizerModel {
  public:
    SentencePieceTokenizer(std::string model, const std::string& source)
        : model_(std::move(model)) {
        const auto status = processor_.LoadFromSerializedProto(model_);
        QK_CHECK(status.ok(), "tokenizer {}: not a SentencePiece model: {}", source,
                 status.ToString());
        QK_CHECK(processor_.GetPieceSize() > 0, "tokenizer {}: the SentencePiece model is empty",
                 source);
    }

    // SentencePiece has no notion of parsing special tokens from text: <bos> written in a text
    // is text. User-defined symbols are always matched, as libsentencepiece does.
    std::vector<int32_t> encode(std::string_view text, bool) const override {
        std::vector<int> ids;
        const auto status = processor_.Encode(text, &ids);
        QK_CHECK(status.ok(), "tokenizer: SentencePiece could not encode the text: {}",
                 status.ToString());
        return {ids.begin(), ids.end()};
    }

    std::string decode(const std::vector<int32_t>& ids) const override {
        for (int32_t id : ids)
            QK_CHECK(id >= 0 && id < vocab_size(),
                     "tokenizer: id {} is outside the SentencePiece vocabulary [0, {})", id,
                     vocab_size());
        std::string text;
        const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
        QK_CHECK(status.ok(), "tokenizer: SentencePiece could not decode: {}", status.ToString());
        return text;
    }

    int64_t vocab_size() const override { return processor_.GetPieceSize(); }
    std::string kind() const override { return "sentencepiece"; }
    std::string file_contents() const override { return model_; }
    std::optional<int32_t> document_separator() const override {
        if (processor_.bos_id() >= 0) return processor_.bos_id();
        if (processor_.eos_id() >= 0) return processor_.eos_id();
        return std::nullopt;
    }
    std::optional<int32_t> token_id(std::string_view token) const override {
        const int id = processor_.PieceToId(token);
        if (id == processor_.unk_id() && token != processor_.IdToPiece(id)) return std::nullopt;
        return id;
    }

  private:
    std::string model_;
    sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::shared_ptr<const TokenizerModel> load_sentencepiece(const std::string& model,
                                                         const std::string& source) {
    return std::make_shared<SentencePieceTokenizer>(model, source);
}

}  // namespace qk::nn
