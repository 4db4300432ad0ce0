// The tokenizer a model trained with, written into its Hugging Face directory (nn/hf/hf.h,
// docs/models.md): what `qknorm export --hf` adds beside config.json and the weights, so that
// transformers' AutoTokenizer.from_pretrained gives the ids the model knows.
#include <nlohmann/json.hpp>
#include <string>

#include "core/safetensors.h"
#include "nn/hf/hf.h"
#include "nn/text/bpe.h"

namespace qk::nn {

namespace {

// Whether a SentencePiece model puts '▁' before a text (its normalizer's add_dummy_prefix): the
// first piece of "a" is then "▁a" or "▁".
bool adds_dummy_prefix(const Tokenizer& sp) {
    const std::vector<int32_t> ids = sp.encode("a", false);
    if (ids.empty()) return false;
    for (const char* piece : {"\u2581a", "\u2581"})
        if (const auto id = sp.model().token_id(piece); id && *id == ids[0]) return true;
    return false;
}

// The SentencePiece tokenizer class transformers reads a bare tokenizer.model with, per family:
// Gemma's own, else Llama's. Neither adds BOS or EOS here, since qknorm's encode adds none and the
// model trained without them; the prefix space is the model's own (Llama's class adds one to
// every text unless told, which gave a model without a dummy prefix another first id).
nlohmann::ordered_json sentencepiece_config(HFFamily family, bool prefix_space) {
    const bool gemma = family == HFFamily::gemma3;
    return {{"tokenizer_class", gemma ? "GemmaTokenizer" : "LlamaTokenizer"},
            {"add_bos_token", false},
            {"add_eos_token", false},
            {"add_prefix_space", prefix_space},
            {"legacy", true}};
}

// The class that reads tokenizer.json as it is. Without it AutoTokenizer picks the family's own
// class (Qwen2Tokenizer for Qwen3), which builds its pipeline anew and gave other ids.
constexpr const char* kFastTokenizerConfig = "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"}\n";

// qknorm's byte tokenizer (token b is byte b) as a tokenizer.json: a byte-level BPE without merges
// whose vocabulary spells byte b as its GPT-2 stand-in, with id b (a trained BPE orders its 256
// byte tokens by stand-in instead).
std::string byte_tokenizer_json() {
    const auto& stand_ins = bpe::byte_stand_ins();
    return bpe::byte_level_tokenizer_json({stand_ins.begin(), stand_ins.end()}, 0, {},
                                          /*use_regex=*/false);
}

}  // namespace

std::vector<std::string> save_hf_tokenizer(const Tokenizer& tokenizer, HFFamily family,
                                           const std::string& dir, std::string* why) {
    const std::string kind = tokenizer.kind();
    if (kind == "bpe") {  // already a tokenizer.json that Hugging Face tokenizers reads
        tokenizer.save(dir + "/tokenizer.json");
        write_file_atomic(dir + "/tokenizer_config.json", kFastTokenizerConfig);
        return {"tokenizer.json", "tokenizer_config.json"};
    }
    if (kind == "bytes") {
        write_file_atomic(dir + "/tokenizer.json", byte_tokenizer_json() + "\n");
        write_file_atomic(dir + "/tokenizer_config.json", kFastTokenizerConfig);
        return {"tokenizer.json", "tokenizer_config.json"};
    }
    if (kind == "sentencepiece") {
        tokenizer.save(dir + "/tokenizer.model");
        write_file_atomic(
            dir + "/tokenizer_config.json",
            sentencepiece_config(family, adds_dummy_prefix(tokenizer)).dump(2) + "\n");
        return {"tokenizer.model", "tokenizer_config.json"};
    }
    if (why)
        *why = kind == "chars"
                   ? "a character tokenizer (one id per character of its corpus) has no Hugging "
                     "Face form; train with --tokenizer byte or a tokenizer.json to export one"
                   : "a mixed text and image tokenizer has no Hugging Face form";
    return {};
}

}  // namespace qk::nn
