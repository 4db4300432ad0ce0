#include "nn/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace qk::nn::bpe {

namespace {

// The length of the valid UTF-8 sequence at text[i], or 0 if it is not one (utf8proc's decoder
// rejects overlong forms, surrogates and code points past U+10FFFF, as UTF-8 requires).
size_t valid_utf8_at(std::string_view text, size_t i) {
    utf8proc_int32_t code_point = 0;
    const utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                         static_cast<utf8proc_ssize_t>(text.size() - i), &code_point);
    return n > 0 ? static_cast<size_t>(n) : 0;
}

std::string normalize_valid(std::string_view run, Normalization form) {
    int options = UTF8PROC_STABLE;
    switch (form) {
        case Normalization::nfc:
            options |= UTF8PROC_COMPOSE;
            break;
        case Normalization::nfd:
            options |= UTF8PROC_DECOMPOSE;
            break;
        case Normalization::nfkc:
            options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
            break;
        case Normalization::nfkd:
            options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
            break;
    }
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                            static_cast<utf8proc_ssize_t>(run.size()), &out,
                                            static_cast<utf8proc_option_t>(options));
    QK_CHECK(n >= 0, "tokenizer: Unicode normalisation failed: {}", utf8proc_errmsg(n));
    std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
}

}  // namespace

std::string normalize(std::string_view text, Normalization form) {
    std::string out;
    out.reserve(text.size());
    size_t run_begin = 0, i = 0;
    while (i < text.size()) {
        if (static_cast<unsigned char>(text[i]) < 0x80) {  // ASCII is its own normal form
            ++i;
            continue;
        }
        const size_t n = valid_utf8_at(text, i);
        if (n > 0) {
            i += n;
            continue;
        }
        out += normalize_valid(text.substr(run_begin, i - run_begin), form);
        out += text[i];  // an invalid byte stays as it is
        run_begin = ++i;
    }
    out += normalize_valid(text.substr(run_begin), form);
    return out;
}

// ---- Regex -----------------------------------------------------------------------------------

struct Regex::Compiled {
    pcre2_code* code = nullptr;
    ~Compiled() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, bool literal)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
    // UCP: \s, \w, \d and the POSIX classes use Unicode properties, as Oniguruma (the regex
    // engine of Hugging Face tokenizers) does. MATCH_INVALID_UTF: invalid bytes in a subject are
    // never matched, rather than an error.
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    if (literal) options |= PCRE2_LITERAL;
    int error = 0;
    PCRE2_SIZE offset = 0;
    compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                    options, &error, &offset, nullptr);
    if (!compiled_->code) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error, message, sizeof message);
        throw Error(fmt::format("tokenizer: bad regex '{}' at offset {}: {}", pattern, offset,
                                reinterpret_cast<const char*>(message)));
    }
    // Without a JIT (some architectures) pcre2_match interprets the pattern: slower, the same.
    pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<Span>& matches,
                     std::chrono::steady_clock::time_point deadline) const {
    matches.clear();
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
    QK_CHECK(data, "tokenizer: out of memory for a regex match");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0;
    // Counted across calls: a text cut into many short pieces makes a match or two per piece.
    static thread_local uint32_t calls = 0;
    while (start <= text.size()) {
        if (++calls % 32 == 0 && std::chrono::steady_clock::now() > deadline) {
            pcre2_match_data_free(data);
            throw RegexPastDeadline(fmt::format(
                "tokenizer: the regex '{}' ran past its time budget on a piece of {} bytes",
                pattern_, text.size()));
        }
        const int rc = pcre2_match(compiled_->code, subject, text.size(), start, 0, data, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            pcre2_match_data_free(data);
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof message);
            throw Error(fmt::format("tokenizer: regex '{}' failed: {}", pattern_,
                                    reinterpret_cast<const char*>(message)));
        }
        const PCRE2_SIZE* range = pcre2_get_ovector_pointer(data);
        if (range[1] > range[0]) {
            matches.push_back({range[0], range[1]});
            start = range[1];
        } else {  // empty: step over one character (or one invalid byte)
            const size_t n = range[0] < text.size() ? valid_utf8_at(text, range[0]) : 1;
            start = range[0] + std::max<size_t>(n, 1);
        }
    }
    pcre2_match_data_free(data);
}

// ---- the pre-tokenizer -------------------------------------------------------------------------

namespace {

// One step on one piece: the matches and the gaps between them, in order, then grouped as the
// behaviour says.
void split_piece(const SplitStep& step, std::string_view piece, std::vector<Span>& matches,
                 std::vector<std::string_view>& out,
                 std::chrono::steady_clock::time_point deadline) {
    step.regex->find_all(piece, matches, deadline);
    struct Part {
        Span span;
        bool is_match;
    };
    std::vector<Part> parts;
    size_t at = 0;
    for (const Span& m : matches) {
        if (m.begin > at) parts.push_back({{at, m.begin}, step.invert});
        parts.push_back({m, !step.invert});
        at = m.end;
    }
    if (at < piece.size()) parts.push_back({{at, piece.size()}, step.invert});

    // A match joins its neighbour only when that neighbour is not a match itself (as in
    // Hugging Face tokenizers): two delimiters in a row stay two pieces.
    std::vector<Span> grouped;
    bool previous_match = false;
    if (step.behavior == SplitBehavior::merged_with_next) {  // walks right to left
        for (auto p = parts.rbegin(); p != parts.rend(); ++p) {
            if (p->is_match && !previous_match && !grouped.empty())
                grouped.back().begin = p->span.begin;
            else
                grouped.push_back(p->span);
            previous_match = p->is_match;
        }
        std::reverse(grouped.begin(), grouped.end());
    } else {
        for (const Part& p : parts) {
            const bool joins_previous =
                !grouped.empty() && p.is_match &&
                ((step.behavior == SplitBehavior::merged_with_previous && !previous_match) ||
                 (step.behavior == SplitBehavior::contiguous && previous_match));
            if (joins_previous)
                grouped.back().end = p.span.end;
            else if (step.behavior != SplitBehavior::removed || !p.is_match)
                grouped.push_back(p.span);
            previous_match = p.is_match;
        }
    }
    for (const Span& s : grouped)
        if (s.end > s.begin) out.push_back(piece.substr(s.begin, s.end - s.begin));
}

}  // namespace

void pre_tokenize(const std::vector<SplitStep>& steps, std::string_view text,
                  std::vector<std::string_view>& pieces) {
    pieces.clear();
    if (!text.empty()) pieces.push_back(text);
    std::vector<std::string_view> next;
    std::vector<Span> matches;
    const double seconds =
        kRegexSeconds + kRegexSecondsPerMB * static_cast<double>(text.size()) / (1 << 20);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(seconds));
    for (const SplitStep& step : steps) {
        next.clear();
        try {
            for (std::string_view piece : pieces) split_piece(step, piece, matches, next, deadline);
        } catch (const RegexPastDeadline&) {
            throw Error(fmt::format(
                "tokenizer: the pre-tokenizer's regex '{}' ran past its time budget ({:.1f} s) on "
                "a text of {} bytes; it backtracks far more than a tokenizer's pattern does "
                "(GPT-2's takes ~0.03 s a MB)",
                step.regex->pattern(), seconds, text.size()));
        }
        pieces.swap(next);
    }
}

}  // namespace qk::nn::bpe
