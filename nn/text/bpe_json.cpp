// Reading and writing Hugging Face tokenizer.json files of the byte-level BPE kind. A file is
// hostile input: every field is checked, and anything the engine does not implement is refused
// by name (never guessed), with the file in the message.
#include <nlohmann/json.hpp>

#include <set>
#include <unordered_map>

#include "core/error.h"
#include "core/file_io.h"
#include "nn/text/bpe.h"

namespace qk::nn::bpe {

using json = nlohmann::json;

namespace {

// Ids past this are refused: a tokenizer.json claiming id 2,000,000,000 would otherwise make the
// id -> token table take 48 GB. The largest vocabularies in use are ~260k (Gemma 3).
constexpr int64_t kMaxVocab = int64_t{1} << 22;

struct Reader {
    const std::string& source;

    [[noreturn]] void fail(const std::string& what) const {
        throw Error(fmt::format("tokenizer {}: {}", source, what));
    }
    const json& field(const json& object, const char* key, const char* where) const {
        if (!object.is_object() || !object.contains(key))
            fail(fmt::format("{} has no \"{}\"", where, key));
        return object.at(key);
    }
    bool flag(const json& object, const char* key, bool fallback) const {
        if (!object.contains(key) || object.at(key).is_null()) return fallback;
        if (!object.at(key).is_boolean()) fail(fmt::format("\"{}\" must be true or false", key));
        return object.at(key).get<bool>();
    }
    std::string text(const json& value, const char* what) const {
        if (!value.is_string())
            fail(fmt::format("{} must be a string, got {}", what, value.dump()));
        return value.get<std::string>();
    }
    int32_t id(const json& value, const char* what) const {
        if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
            value.get<int64_t>() >= kMaxVocab)
            fail(fmt::format("{} must be an id in [0, {}), got {}", what, kMaxVocab,
                             value.dump().substr(0, 40)));
        return static_cast<int32_t>(value.get<int64_t>());
    }
};

void set_token(BpeSpec& spec, const Reader& r, int32_t id, std::string bytes,
               const std::string& shown) {
    if (bytes.empty()) r.fail(fmt::format("token {} is empty", id));
    if (spec.tokens.size() <= static_cast<size_t>(id))
        spec.tokens.resize(static_cast<size_t>(id) + 1);
    std::string& slot = spec.tokens[static_cast<size_t>(id)];
    if (!slot.empty() && slot != bytes)
        r.fail(fmt::format("id {} is given to two tokens ('{}' and another)", id, shown));
    slot = std::move(bytes);
}

void read_vocab_and_merges(BpeSpec& spec, const json& model, const Reader& r) {
    const std::string type =
        model.contains("type") ? r.text(model.at("type"), "model.type") : "BPE";
    if (type != "BPE")
        r.fail(
            fmt::format("model type '{}' is not supported (byte-level BPE only; a SentencePiece "
                        "model loads from its tokenizer.model)",
                        type));
    if (model.contains("dropout") && !model.at("dropout").is_null() &&
        model.at("dropout").get<double>() != 0)
        r.fail("BPE dropout is not supported");
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (model.contains(affix) && !model.at(affix).is_null() && model.at(affix) != "")
            r.fail(fmt::format("\"{}\" is not supported (not a byte-level BPE)", affix));
    if (r.flag(model, "byte_fallback", false))
        r.fail(
            "byte_fallback BPE is SentencePiece-style, not byte-level: load its tokenizer.model");
    spec.ignore_merges = r.flag(model, "ignore_merges", false);

    const json& vocab = r.field(model, "vocab", "model");
    if (!vocab.is_object()) r.fail("model.vocab must be an object of token: id");
    if (static_cast<int64_t>(vocab.size()) > kMaxVocab)
        r.fail(fmt::format("{} tokens is more than the {} supported", vocab.size(), kMaxVocab));
    std::set<std::string> added;
    for (const AddedToken& t : spec.added) added.insert(t.content);
    for (const auto& [token, id] : vocab.items()) {
        // An added token in the vocabulary ("<|endoftext|>" in GPT-2's) is written as it is.
        auto bytes = added.count(token) ? std::optional<std::string>(token) : from_stand_ins(token);
        if (!bytes)
            r.fail(
                fmt::format("token '{}' has characters that are not byte stand-ins: not a "
                            "byte-level BPE vocabulary",
                            token.substr(0, 40)));
        set_token(spec, r, r.id(id, "a vocab id"), std::move(*bytes), token);
    }
    std::unordered_map<std::string, int32_t> ids;
    for (size_t id = 0; id < spec.tokens.size(); ++id)
        if (!spec.tokens[id].empty()) ids.emplace(spec.tokens[id], static_cast<int32_t>(id));

    const json& merges = r.field(model, "merges", "model");
    if (!merges.is_array()) r.fail("model.merges must be an array");
    std::set<std::pair<int32_t, int32_t>> seen;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const json& m = merges[rank];
        std::string left, right;
        if (m.is_string()) {  // the older form, "left right"
            const std::string s = m.get<std::string>();
            const size_t space = s.find(' ');
            if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
                r.fail(fmt::format("merge #{} '{}' is not two tokens with one space", rank, s));
            left = s.substr(0, space), right = s.substr(space + 1);
        } else if (m.is_array() && m.size() == 2) {
            left = r.text(m[0], "a merge's token"), right = r.text(m[1], "a merge's token");
        } else {
            r.fail(fmt::format("merge #{} is {}, not \"a b\" or [a, b]", rank,
                               m.dump().substr(0, 40)));
        }
        const auto a = from_stand_ins(left), b = from_stand_ins(right);
        const auto ia = a ? ids.find(*a) : ids.end(), ib = b ? ids.find(*b) : ids.end();
        if (ia == ids.end() || ib == ids.end())
            r.fail(fmt::format("merge #{} '{} {}' names a token not in the vocabulary", rank, left,
                               right));
        if (!ids.count(*a + *b))
            r.fail(fmt::format("merge #{} '{} {}' makes '{}{}', which is not in the vocabulary",
                               rank, left, right, left, right));
        if (!seen.insert({ia->second, ib->second}).second)
            r.fail(fmt::format("merge #{} '{} {}' is listed twice", rank, left, right));
        spec.merges.push_back({ia->second, ib->second});
    }
}

void read_added_tokens(BpeSpec& spec, const json& root, const Reader& r) {
    if (!root.contains("added_tokens") || root.at("added_tokens").is_null()) return;
    const json& added = root.at("added_tokens");
    if (!added.is_array()) r.fail("added_tokens must be an array");
    for (const json& t : added) {
        AddedToken token;
        token.id = r.id(r.field(t, "id", "an added token"), "an added token's id");
        token.content = r.text(r.field(t, "content", "an added token"), "an added token's content");
        if (token.content.empty()) r.fail(fmt::format("added token {} is empty", token.id));
        token.special = r.flag(t, "special", false);
        token.lstrip = r.flag(t, "lstrip", false);
        token.rstrip = r.flag(t, "rstrip", false);
        if (r.flag(t, "single_word", false))
            r.fail(fmt::format("added token '{}': single_word is not supported", token.content));
        set_token(spec, r, token.id, token.content, token.content);
        spec.added.push_back(std::move(token));
    }
}

void read_normalizer(BpeSpec& spec, const json& n, const Reader& r) {
    if (n.is_null()) return;
    const std::string type = r.text(r.field(n, "type", "the normalizer"), "normalizer.type");
    if (type == "Sequence") {
        for (const json& inner : r.field(n, "normalizers", "a Sequence normalizer"))
            read_normalizer(spec, inner, r);
        return;
    }
    static const std::unordered_map<std::string, Normalization> forms{
        {"NFC", Normalization::nfc},
        {"NFD", Normalization::nfd},
        {"NFKC", Normalization::nfkc},
        {"NFKD", Normalization::nfkd}};
    const auto it = forms.find(type);
    if (it == forms.end())
        r.fail(
            fmt::format("normalizer '{}' is not supported (NFC, NFD, NFKC, NFKD, Sequence)", type));
    spec.normalizers.push_back(it->second);
}

SplitBehavior split_behavior(const std::string& name, const Reader& r) {
    static const std::unordered_map<std::string, SplitBehavior> behaviors{
        {"Isolated", SplitBehavior::isolated},
        {"Removed", SplitBehavior::removed},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous},
        {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    const auto it = behaviors.find(name);
    if (it == behaviors.end()) r.fail(fmt::format("Split behavior '{}' is not supported", name));
    return it->second;
}

// Returns whether a ByteLevel step was seen.
bool read_pre_tokenizer(BpeSpec& spec, const json& p, const Reader& r) {
    if (p.is_null()) return false;
    const std::string type = r.text(r.field(p, "type", "the pre_tokenizer"), "pre_tokenizer.type");
    if (type == "Sequence") {
        bool byte_level = false;
        for (const json& inner : r.field(p, "pretokenizers", "a Sequence pre_tokenizer"))
            byte_level = read_pre_tokenizer(spec, inner, r) || byte_level;
        return byte_level;
    }
    if (type == "ByteLevel") {
        if (r.flag(p, "add_prefix_space", false)) {
            if (!spec.pre_tokenizer.empty())
                r.fail(
                    "ByteLevel with add_prefix_space after another pre-tokenizer step is not "
                    "supported");
            spec.add_prefix_space = true;
        }
        if (r.flag(p, "use_regex", true))
            spec.pre_tokenizer.push_back({std::make_shared<Regex>(kGpt2Pattern)});
        return true;
    }
    if (type == "Split") {
        const json& pattern = r.field(p, "pattern", "a Split pre_tokenizer");
        SplitStep step;
        if (pattern.contains("Regex"))
            step.regex = std::make_shared<Regex>(r.text(pattern.at("Regex"), "pattern.Regex"));
        else if (pattern.contains("String"))
            step.regex = std::make_shared<Regex>(r.text(pattern.at("String"), "pattern.String"),
                                                 /*literal=*/true);
        else
            r.fail("a Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
        step.behavior = split_behavior(
            r.text(r.field(p, "behavior", "a Split pre_tokenizer"), "Split.behavior"), r);
        step.invert = r.flag(p, "invert", false);
        spec.pre_tokenizer.push_back(std::move(step));
        return false;
    }
    if (type == "Digits") {
        const bool individual = r.flag(p, "individual_digits", false);
        spec.pre_tokenizer.push_back(
            {std::make_shared<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)"),
             SplitBehavior::isolated, false});
        return false;
    }
    r.fail(fmt::format("pre_tokenizer '{}' is not supported (ByteLevel, Split, Digits, Sequence)",
                       type));
}

}  // namespace

BpeSpec parse_tokenizer_json(const std::string& json_text, const std::string& source) {
    const Reader r{source};
    json root;
    try {
        root = json::parse(json_text);
    } catch (const json::exception& e) {
        r.fail(fmt::format("not JSON: {}", json_error_text(e)));
    }
    if (!root.is_object()) r.fail("the top level must be a JSON object");
    BpeSpec spec;
    try {
        read_added_tokens(spec, root, r);
        read_vocab_and_merges(spec, r.field(root, "model", "the file"), r);
        if (root.contains("normalizer")) read_normalizer(spec, root.at("normalizer"), r);
        const bool byte_level =
            root.contains("pre_tokenizer") && read_pre_tokenizer(spec, root.at("pre_tokenizer"), r);
        if (!byte_level) r.fail("the pre_tokenizer has no ByteLevel step: not a byte-level BPE");
        if (root.contains("decoder") && !root.at("decoder").is_null() &&
            r.text(r.field(root.at("decoder"), "type", "the decoder"), "decoder.type") !=
                "ByteLevel")
            r.fail(fmt::format("decoder '{}' is not supported (ByteLevel)",
                               root.at("decoder").at("type").get<std::string>()));
    } catch (const json::exception& e) {
        r.fail(fmt::format("malformed: {}", json_error_text(e)));
    }
    spec.json = json_text;
    return spec;
}

std::string byte_level_tokenizer_json(
    const std::vector<std::string>& tokens, size_t specials,
    const std::vector<std::pair<std::string, std::string>>& merges, bool use_regex) {
    using json = nlohmann::ordered_json;  // the vocabulary in id order, as tokenizers writes it
    json vocab = json::object(), merge_list = json::array(), added = json::array();
    for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
    for (const auto& [left, right] : merges) merge_list.push_back(json::array({left, right}));
    for (size_t id = 0; id < specials; ++id)
        added.push_back({{"id", id},
                         {"content", tokens[id]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
    const json byte_level = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", use_regex}};
    const json file = {{"version", "1.0"},
                       {"truncation", nullptr},
                       {"padding", nullptr},
                       {"added_tokens", added},
                       {"normalizer", nullptr},
                       {"pre_tokenizer", byte_level},
                       {"post_processor", nullptr},
                       {"decoder", byte_level},
                       {"model",
                        {{"type", "BPE"},
                         {"dropout", nullptr},
                         {"unk_token", nullptr},
                         {"continuing_subword_prefix", nullptr},
                         {"end_of_word_suffix", nullptr},
                         {"fuse_unk", false},
                         {"byte_fallback", false},
                         {"ignore_merges", false},
                         {"vocab", vocab},
                         {"merges", merge_list}}}};
    return file.dump();
}

}  // namespace qk::nn::bpe
