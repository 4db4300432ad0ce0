// A SentencePiece model (Gemma's tokenizer.model) as a TokenizerModel, through libsentencepiece.
// Internal: no SentencePiece header shows here, so a user's compile flags never need it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nn/text/tokenizer.h"

namespace qk::nn {

// `model` is the file's bytes (a serialized ModelProto); `source` names it in errors.
std::shared_ptr<const TokenizerModel> load_sentencepiece(const std::string& model,
                                                         const std::string& source);

// libsentencepiece needs ~235 bytes of memory per input byte (one 20 MB line died under a 3 GB
// limit), so a longer text goes in as spans of about this many bytes, each encoded alone.
inline constexpr size_t kSentencePieceSpan = size_t{1} << 18;

// How a span may start so that its ids equal the whole text's there. No piece runs across a
// single space between two printable ASCII characters (pieces start at the space's '▁'), so a
// cut there is exact: `keep_space` starts the next span at the space (models without a dummy
// prefix), `drop_space` just after it (the dummy prefix '▁' stands in for it). `none`: the model
// does neither, and every cut is a character boundary whose seam may tokenize differently.
enum class SpaceCut { keep_space, drop_space, none };

// The [begin, end) spans `text` is encoded in: one when it is at most `span` bytes; else each
// cut at the first exact space from `span` bytes on (looking up to 4 · span), or failing that at
// the UTF-8 character boundary at or before `span`. drop_space leaves the space out.
std::vector<std::pair<size_t, size_t>> sentencepiece_spans(std::string_view text, SpaceCut cut,
                                                           size_t span = kSentencePieceSpan);

}  // namespace qk::nn
