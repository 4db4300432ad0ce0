// A SentencePiece model (Gemma's tokenizer.model) as a TokenizerModel, through libsentencepiece.
// Internal: no SentencePiece header shows here, so a user's compile flags never need it.
#pragma once

#include <memory>
#include <string>

#include "nn/text/tokenizer.h"

namespace qk::nn {

// `model` is the file's bytes (a serialized ModelProto); `source` names it in errors.
std::shared_ptr<const TokenizerModel> load_sentencepiece(const std::string& model,
                                                         const std::string& source);

}  // namespace qk::nn
