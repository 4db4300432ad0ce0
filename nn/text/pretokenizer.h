// The text side of a byte-level BPE tokenizer, before any merge: Unicode normalisation
// (utf8proc) and the pre-tokenizer, which cuts text into pieces with Unicode regexes (PCRE2, with
// its JIT). Internal to the library: no PCRE2 or utf8proc type shows here, so a user's compile
// flags never need them (nn/text/bpe.h is the public side).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qk::nn::bpe {

enum class Normalization { nfc, nfd, nfkc, nfkd };

// The text in the given Unicode normal form. Bytes that are not valid UTF-8 are kept as they are,
// and each valid run between them is normalised on its own: byte-level BPE takes any bytes.
std::string normalize(std::string_view text, Normalization form);

// A byte range [begin, end) of a text.
struct Span {
    size_t begin, end;
};

// A Unicode regex (PCRE2 in UTF mode with Unicode properties, so \p{L}, \s and \w mean their
// Unicode classes; compiled by its JIT). Invalid UTF-8 in a subject never matches: it is left
// to the gaps between matches.
// What Regex::find_all throws past its deadline.
struct RegexPastDeadline : Error {
    using Error::Error;
};

class Regex {
  public:
    // Throws qk::Error with PCRE2's message and the offset in the pattern; `literal` matches the
    // pattern as a plain string.
    explicit Regex(const std::string& pattern, bool literal = false);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Every match, left to right, none overlapping (an empty match moves on by one character).
    // Past `deadline` it throws qk::Error: PCRE2 bounds each match, not a text's many, and a
    // pattern that backtracks ("(a|a)*b") stayed under that bound on every piece of an 80 kB text
    // and took two minutes.
    void find_all(std::string_view text, std::vector<Span>& matches,
                  std::chrono::steady_clock::time_point deadline =
                      std::chrono::steady_clock::time_point::max()) const;
    const std::string& pattern() const { return pattern_; }

  private:
    struct Compiled;
    std::string pattern_;
    std::unique_ptr<Compiled> compiled_;
};

// What a Split step does with the matches of its regex (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

struct SplitStep {
    std::shared_ptr<const Regex> regex;
    SplitBehavior behavior = SplitBehavior::isolated;
    bool invert = false;  // the gaps are what the behaviour applies to, and the matches the rest
};

// GPT-2's pattern: contractions, letters, numbers, other symbols, each with one optional leading
// space, and white space (a run of spaces gives all but its last one to the next word).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Cuts `text` into the pieces `steps` give, each step applied to every piece of the one before.
// Pieces are views into text; none is empty. The regexes get kRegexSeconds plus
// kRegexSecondsPerMB per MB of text in all (GPT-2's pattern takes ~0.03 s a MB here), then
// qk::Error names the pattern.
inline constexpr double kRegexSeconds = 0.5, kRegexSecondsPerMB = 2.0;
void pre_tokenize(const std::vector<SplitStep>& steps, std::string_view text,
                  std::vector<std::string_view>& pieces);

}  // namespace qk::nn::bpe
