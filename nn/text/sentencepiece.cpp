#include "nn/text/sentencepiece.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "core/error.h"

namespace qk::nn {

namespace {

// libsentencepiece's status without its source location ("Internal: ./src/sentencepiece_
// processor.cc(232) [model_proto->ParseFromArray(...)]" says nothing to a user).
std::string reason(const sentencepiece::util::Status& status) {
    const std::string message = status.message();
    if (message.find(".cc(") != std::string::npos) return "libsentencepiece could not read it";
    return message;
}

bool printable_ascii(char c) { return c > ' ' && c <= '~'; }

// The cut this model tokenizes exactly, found on a probe: encoded whole and in two at each space.
SpaceCut probe_space_cut(const sentencepiece::SentencePieceProcessor& sp) {
    const std::string probe = "to be or not to be that is the question";
    std::vector<int> whole, left, right;
    if (!sp.Encode(probe, &whole).ok()) return SpaceCut::none;
    for (const SpaceCut mode : {SpaceCut::keep_space, SpaceCut::drop_space}) {
        bool exact = true;
        for (size_t at = probe.find(' '); exact && at != std::string::npos;
             at = probe.find(' ', at + 1)) {
            const size_t next = mode == SpaceCut::keep_space ? at : at + 1;
            exact = sp.Encode(probe.substr(0, at), &left).ok() &&
                    sp.Encode(probe.substr(next), &right).ok();
            left.insert(left.end(), right.begin(), right.end());
            exact = exact && left == whole;
        }
        if (exact) return mode;
    }
    return SpaceCut::none;
}

class SentencePieceTokenizer final : public TokenizerModel {
  public:
    SentencePieceTokenizer(std::string model, const std::string& source)
        : model_(std::move(model)) {
        const auto status = processor_.LoadFromSerializedProto(model_);
        QK_CHECK(status.ok(), "tokenizer {}: not a SentencePiece model ({})", source,
                 reason(status));
        QK_CHECK(processor_.GetPieceSize() > 0, "tokenizer {}: the SentencePiece model is empty",
                 source);
        space_cut_ = probe_space_cut(processor_);
    }

    // SentencePiece has no notion of parsing special tokens from text: <bos> written in a text
    // is text. User-defined symbols are always matched, as libsentencepiece does.
    std::vector<int32_t> encode(std::string_view text, bool) const override {
        std::vector<int32_t> out;
        std::vector<int> ids;
        for (const auto& [begin, end] : sentencepiece_spans(text, space_cut_)) {
            const auto status = processor_.Encode(text.substr(begin, end - begin), &ids);
            QK_CHECK(status.ok(), "tokenizer: SentencePiece could not encode the text ({})",
                     reason(status));
            out.insert(out.end(), ids.begin(), ids.end());
        }
        return out;
    }

    std::string decode(const std::vector<int32_t>& ids) const override {
        for (int32_t id : ids)
            QK_CHECK(id >= 0 && id < vocab_size(),
                     "tokenizer: id {} is outside the SentencePiece vocabulary [0, {})", id,
                     vocab_size());
        std::string text;
        const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
        QK_CHECK(status.ok(), "tokenizer: SentencePiece could not decode ({})", reason(status));
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
    SpaceCut space_cut_ = SpaceCut::none;
};

}  // namespace

std::vector<std::pair<size_t, size_t>> sentencepiece_spans(std::string_view text, SpaceCut cut,
                                                           size_t span) {
    std::vector<std::pair<size_t, size_t>> spans;
    for (size_t begin = 0; begin < text.size();) {
        if (text.size() - begin <= span) {
            spans.emplace_back(begin, text.size());
            break;
        }
        size_t end = begin + span, next = 0;
        const size_t last = std::min(text.size() - 1, begin + 4 * span);
        for (size_t at = end; cut != SpaceCut::none && at < last; ++at) {
            if (text[at] == ' ' && printable_ascii(text[at - 1]) && printable_ascii(text[at + 1])) {
                end = at;
                next = cut == SpaceCut::keep_space ? at : at + 1;
                break;
            }
        }
        if (next == 0) {  // no exact cut: a character boundary (never inside a UTF-8 sequence)
            while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
            next = end;
        }
        spans.emplace_back(begin, end);
        begin = next;
    }
    return spans;
}

std::shared_ptr<const TokenizerModel> load_sentencepiece(const std::string& model,
                                                         const std::string& source) {
    return std::make_shared<SentencePieceTokenizer>(model, source);
}

}  // namespace qk::nn
