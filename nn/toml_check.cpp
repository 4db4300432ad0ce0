// The strict TOML-subset checker (see nn/toml_check.h): one pass over the text, recursive only
// in nested arrays, whose depth is bounded so that hostile input cannot exhaust the stack.
#include "nn/toml_check.h"

#include <cctype>
#include <map>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace qk::nn {

namespace {

constexpr int kMaxArrayDepth = 32;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
bool is_bare_key_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

// One or more digits from i, with single underscores between digits (TOML's 1_000).
bool scan_digits(std::string_view s, size_t& i) {
    const size_t start = i;
    while (i < s.size() && (is_digit(s[i]) || (s[i] == '_' && i > start && is_digit(s[i - 1]) &&
                                               i + 1 < s.size() && is_digit(s[i + 1]))))
        ++i;
    return i > start;
}

bool is_toml_number(std::string_view s) {
    size_t i = 0;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (s.substr(i) == "inf" || s.substr(i) == "nan") return true;
    const size_t int_begin = i;
    if (!scan_digits(s, i)) return false;
    if (s[int_begin] == '0' && i - int_begin > 1) return false;  // TOML forbids leading zeros
    if (i < s.size() && s[i] == '.' && !scan_digits(s, ++i)) return false;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        if (!scan_digits(s, i)) return false;
    }
    return i == s.size();
}

class TomlChecker {
  public:
    TomlChecker(const std::string& text, const std::string& origin)
        : text_(text), origin_(origin) {}
    void run();

  private:
    [[noreturn]] void fail(int64_t line, const std::string& what) const {
        throw Error(fmt::format("{}:{}: {}", origin_, line, what));
    }
    bool at_end() const { return pos_ >= text_.size(); }
    char peek() const { return at_end() ? '\0' : text_[pos_]; }
    bool at_line_end() const { return at_end() || peek() == '\n' || peek() == '#'; }
    std::string rest_of_line() const;
    bool looks_like_key_value() const;

    void skip_blanks();
    void skip_blanks_and_newlines();
    void end_line(const std::string& after);
    void section();
    void key_value();
    std::string key();
    void value(const std::string& key, int depth);
    void string_value();
    void escape();
    void array(const std::string& key, int depth);
    void scalar(const std::string& key);

    const std::string& text_;
    const std::string& origin_;
    size_t pos_ = 0;
    int64_t line_ = 1;
    std::string section_;  // "" for the keys before the first header
    std::map<std::string, int64_t> sections_;
    std::map<std::pair<std::string, std::string>, int64_t> keys_;
};

std::string TomlChecker::rest_of_line() const {
    const size_t end = text_.find('\n', pos_);
    const std::string rest = text_.substr(pos_, std::min<size_t>(end - pos_, 40));
    return rest.empty() ? "the end of the line" : "'" + rest + "'";
}

// After an array's newline, "name = ..." means the array was never closed.
bool TomlChecker::looks_like_key_value() const {
    size_t i = pos_;
    while (i < text_.size() && (is_bare_key_char(text_[i]) || text_[i] == '.')) ++i;
    if (i == pos_) return false;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t')) ++i;
    return i < text_.size() && text_[i] == '=';
}

void TomlChecker::skip_blanks() {
    while (peek() == ' ' || peek() == '\t' ||
           (peek() == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n'))
        ++pos_;
}

void TomlChecker::skip_blanks_and_newlines() {
    for (;;) {
        skip_blanks();
        if (peek() == '#') pos_ = std::min(text_.find('\n', pos_), text_.size());
        if (at_end() || peek() != '\n') return;
        ++pos_, ++line_;
    }
}

void TomlChecker::end_line(const std::string& after) {
    skip_blanks();
    if (peek() == '#') pos_ = std::min(text_.find('\n', pos_), text_.size());
    if (at_end()) return;
    if (peek() != '\n') fail(line_, fmt::format("unexpected {} after {}", rest_of_line(), after));
    ++pos_, ++line_;
}

void TomlChecker::run() {
    while (!at_end()) {
        skip_blanks();
        if (peek() == '[')
            section();
        else if (!at_line_end())
            key_value();
        else
            end_line("a blank line");
    }
}

void TomlChecker::section() {
    const size_t start = pos_;
    ++pos_;
    skip_blanks();
    const size_t name_begin = pos_;
    while (is_bare_key_char(peek()) || peek() == '.') ++pos_;
    const std::string name = text_.substr(name_begin, pos_ - name_begin);
    skip_blanks();
    if (name.empty() || peek() != ']') {
        pos_ = start;
        fail(line_, fmt::format("bad section header {} (expected [name])", rest_of_line()));
    }
    ++pos_;
    const auto [it, fresh] = sections_.emplace(name, line_);
    if (!fresh)
        fail(line_, fmt::format("section [{}] appears twice (first at line {})", name, it->second));
    section_ = name;
    end_line(fmt::format("the section header [{}]", name));
}

std::string TomlChecker::key() {
    const size_t begin = pos_;
    if (peek() == '"' || peek() == '\'') {
        string_value();
        return text_.substr(begin, pos_ - begin);
    }
    while (is_bare_key_char(peek()) || peek() == '.') ++pos_;
    if (pos_ == begin)
        fail(line_, fmt::format("expected a [section], a key = value or a comment, found {}",
                                rest_of_line()));
    return text_.substr(begin, pos_ - begin);
}

void TomlChecker::key_value() {
    const int64_t line = line_;
    const std::string name = key();
    skip_blanks();
    if (peek() != '=')
        fail(line_, fmt::format("expected '=' after the key '{}', found {}", name, rest_of_line()));
    ++pos_;
    skip_blanks();
    if (at_line_end()) fail(line_, fmt::format("the key '{}' has no value", name));
    const auto [it, fresh] = keys_.emplace(std::make_pair(section_, name), line);
    if (!fresh)
        fail(line, fmt::format("the key '{}' is set twice in [{}] (first at line {})", name,
                               section_, it->second));
    value(name, 0);
    end_line(fmt::format("the value of '{}'", name));
}

void TomlChecker::value(const std::string& key, int depth) {
    if (peek() == '"' || peek() == '\'')
        string_value();
    else if (peek() == '[')
        array(key, depth + 1);
    else
        scalar(key);
}

void TomlChecker::string_value() {
    const char quote = text_[pos_++];
    if (quote == '"' && text_.compare(pos_, 2, "\"\"") == 0)
        fail(line_, "multi-line strings (\"\"\") are not supported");
    for (;;) {
        if (at_end() || peek() == '\n')
            fail(line_, fmt::format("unclosed string: no closing {} on the line", quote));
        const char c = text_[pos_++];
        if (c == quote) return;
        if (c == '\\' && quote == '"') escape();
    }
}

void TomlChecker::escape() {
    const char c = peek();
    const size_t hex = c == 'u' ? 4 : c == 'U' ? 8 : 0;
    const bool simple = std::string_view("btnfr\"\\").find(c) != std::string_view::npos;
    if (c == '\0' || (!simple && hex == 0))
        fail(line_, fmt::format("bad escape '\\{}' in a string", std::string(1, c)));
    ++pos_;
    for (size_t i = 0; i < hex; ++i, ++pos_)
        if (!is_hex(peek()))
            fail(line_, fmt::format("bad escape '\\{}' in a string: needs {} hex digits", c, hex));
}

void TomlChecker::array(const std::string& key, int depth) {
    if (depth > kMaxArrayDepth)
        fail(line_, fmt::format("arrays nested deeper than {} in '{}'", kMaxArrayDepth, key));
    const int64_t open_line = line_;
    const auto unclosed = [&] {
        fail(open_line,
             fmt::format("unclosed array: the '[' of '{}' has no ']' before {}", key,
                         at_end() ? "the end of the file" : fmt::format("line {}", line_)));
    };
    ++pos_;
    for (;;) {
        skip_blanks_and_newlines();
        if (peek() == ']') break;
        if (at_end() || looks_like_key_value()) unclosed();
        value(key, depth);
        skip_blanks_and_newlines();
        if (peek() == ']') break;
        if (at_end() || looks_like_key_value()) unclosed();
        if (peek() != ',')
            fail(line_, fmt::format("expected ',' or ']' in the array of '{}', found {}", key,
                                    rest_of_line()));
        ++pos_;
    }
    ++pos_;
}

void TomlChecker::scalar(const std::string& key) {
    const size_t begin = pos_;
    while (!at_end() && std::string_view(" \t\r\n,]#").find(peek()) == std::string_view::npos)
        ++pos_;
    const std::string token = text_.substr(begin, pos_ - begin);
    if (token.empty())
        fail(line_, fmt::format("expected a value for '{}', found {}", key, rest_of_line()));
    if (token != "true" && token != "false" && !is_toml_number(token))
        fail(line_, fmt::format("the value '{}' of '{}' is not a string, number, boolean or array",
                                token, key));
}

}  // namespace

void check_toml_syntax(const std::string& text, const std::string& origin) {
    TomlChecker(text, origin).run();
}

}  // namespace qk::nn
