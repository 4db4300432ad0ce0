#include "nn/text/bpe.h"

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace qk::nn::bpe {

// ---- the byte stand-ins ------------------------------------------------------------------------

namespace {

bool printable_latin1(int byte) {
    return (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) ||
           (byte >= 0xae && byte <= 0xff);
}

std::string utf8_of(uint32_t code_point) {  // below U+0800: one or two bytes
    if (code_point < 0x80) return std::string(1, static_cast<char>(code_point));
    return {static_cast<char>(0xc0 | (code_point >> 6)),
            static_cast<char>(0x80 | (code_point & 0x3f))};
}

// Stand-in code point -> byte, for the 256 code points below U+0144; -1 elsewhere.
const std::array<int, 0x144>& stand_in_bytes() {
    static const std::array<int, 0x144> table = [] {
        std::array<int, 0x144> t{};
        t.fill(-1);
        int extra = 0;
        for (int byte = 0; byte < 256; ++byte)
            t[printable_latin1(byte) ? byte : 0x100 + extra++] = byte;
        return t;
    }();
    return table;
}

}  // namespace

const std::array<std::string, 256>& byte_stand_ins() {
    static const std::array<std::string, 256> table = [] {
        std::array<std::string, 256> t;
        const auto& bytes = stand_in_bytes();
        for (uint32_t cp = 0; cp < bytes.size(); ++cp)
            if (bytes[cp] >= 0) t[static_cast<size_t>(bytes[cp])] = utf8_of(cp);
        return t;
    }();
    return table;
}

std::string to_stand_ins(std::string_view bytes) {
    std::string out;
    for (unsigned char b : bytes) out += byte_stand_ins()[b];
    return out;
}

std::optional<std::string> from_stand_ins(std::string_view text) {
    std::string out;
    const auto& bytes = stand_in_bytes();
    for (size_t i = 0; i < text.size();) {
        const auto lead = static_cast<unsigned char>(text[i]);
        uint32_t cp = lead;
        size_t n = 1;
        if (lead >= 0xc0 && lead < 0xe0 && i + 1 < text.size()) {  // every stand-in is < U+0800
            cp = ((lead & 0x1fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3fu);
            n = 2;
        } else if (lead >= 0x80) {
            return std::nullopt;
        }
        if (cp >= bytes.size() || bytes[cp] < 0) return std::nullopt;
        out.push_back(static_cast<char>(bytes[cp]));
        i += n;
    }
    return out;
}

// ---- the model ---------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)) {
    for (size_t id = 0; id < spec_.tokens.size(); ++id)
        if (!spec_.tokens[id].empty())
            token_ids_.emplace(spec_.tokens[id], static_cast<int32_t>(id));
    for (int byte = 0; byte < 256; ++byte) {
        const char c = static_cast<char>(byte);
        const auto found = token_ids_.find(std::string_view(&c, 1));
        QK_CHECK(found != token_ids_.end(),
                 "tokenizer: byte-level BPE has no token for byte 0x{:02x} ('{}'); every byte "
                 "needs one",
                 byte, byte_stand_ins()[static_cast<size_t>(byte)]);
        byte_token_[static_cast<size_t>(byte)] = found->second;
    }
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
        const auto [left, right] = spec_.merges[rank];
        const std::string joined =
            spec_.tokens[static_cast<size_t>(left)] + spec_.tokens[static_cast<size_t>(right)];
        const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
        rules_.emplace(key, MergeRule{static_cast<int32_t>(rank), token_ids_.at(joined)});
    }
    for (const AddedToken& t : spec_.added)
        starts_added_[static_cast<unsigned char>(t.content[0])] = true;
    // Longest first, so that the first added token matching at a position is the longest one.
    std::stable_sort(spec_.added.begin(), spec_.added.end(),
                     [](const AddedToken& a, const AddedToken& b) {
                         return a.content.size() > b.content.size();
                     });
}

std::optional<MergeRule> BpeTokenizer::rule(int32_t left, int32_t right) const {
    const auto it = rules_.find((static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right));
    if (it == rules_.end()) return std::nullopt;
    return it->second;
}

// The merge rule on one piece. The symbols form a linked list over the piece's bytes; a min-heap
// holds every adjacent pair that has a rule, by (rank, position). A popped pair whose symbols
// have changed since it was pushed is stale and skipped; a merge pushes the two pairs it makes
// with its neighbours. O(n log n) for a piece of n bytes (a naive rescan is O(n^2), and a piece
// can be a whole line of CJK text or of spaces).
void BpeTokenizer::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
    const auto n = static_cast<int32_t>(piece.size());
    struct Symbol {
        int32_t id, prev, next;  // prev/next: neighbouring live symbols, -1 at the ends
    };
    std::vector<Symbol> symbols(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
        symbols[static_cast<size_t>(i)] = {byte_token_[static_cast<unsigned char>(piece[i])], i - 1,
                                           i + 1 < n ? i + 1 : -1};
    struct Candidate {
        int32_t rank, left, left_id, right_id;
        bool operator>(const Candidate& o) const {
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push_pair = [&](int32_t left) {
        if (left < 0) return;
        const int32_t right = symbols[static_cast<size_t>(left)].next;
        if (right < 0) return;
        const int32_t a = symbols[static_cast<size_t>(left)].id;
        const int32_t b = symbols[static_cast<size_t>(right)].id;
        if (const auto r = rule(a, b)) heap.push({r->rank, left, a, b});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
    while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        Symbol& left = symbols[static_cast<size_t>(c.left)];
        if (left.id != c.left_id || left.next < 0) continue;  // stale
        Symbol& right = symbols[static_cast<size_t>(left.next)];
        if (right.id != c.right_id) continue;
        left.id = rule(c.left_id, c.right_id)->merged;
        right.id = -1;  // gone
        left.next = right.next;
        if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
        push_pair(left.prev);
        push_pair(c.left);
    }
    for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
        out.push_back(symbols[static_cast<size_t>(i)].id);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
        out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
        return;
    }
    if (spec_.ignore_merges) {
        if (const auto it = token_ids_.find(piece); it != token_ids_.end()) {
            out.push_back(it->second);
            return;
        }
    }
    {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        if (const auto it = cache_.find(piece); it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t first = out.size();
    merge_piece(piece, out);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheLimit) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + first, out.end()));
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string changed;
    if (!spec_.normalizers.empty()) {
        changed = std::string(text);
        for (Normalization form : spec_.normalizers) changed = normalize(changed, form);
        text = changed;
    }
    if (spec_.add_prefix_space && text.front() != ' ') {
        std::string spaced(1, ' ');
        spaced.append(text);
        changed.swap(spaced);
        text = changed;
    }
    std::vector<std::string_view> pieces;
    pre_tokenize(spec_.pre_tokenizer, text, pieces);
    for (std::string_view piece : pieces) encode_piece(piece, out);
}

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3);
    if (!parse_special || spec_.added.empty()) {
        encode_ordinary(text, out);
        return out;
    }
    // Cut out the added tokens, leftmost first, the longest one at a position.
    size_t plain_begin = 0;
    for (size_t i = 0; i < text.size();) {
        const AddedToken* hit = nullptr;
        if (starts_added_[static_cast<unsigned char>(text[i])])
            for (const AddedToken& t : spec_.added)
                if (text.compare(i, t.content.size(), t.content) == 0) {
                    hit = &t;
                    break;
                }
        if (!hit) {
            ++i;
            continue;
        }
        size_t plain_end = i, after = i + hit->content.size();
        if (hit->lstrip)
            while (plain_end > plain_begin && is_space(text[plain_end - 1])) --plain_end;
        if (hit->rstrip)
            while (after < text.size() && is_space(text[after])) ++after;
        encode_ordinary(text.substr(plain_begin, plain_end - plain_begin), out);
        out.push_back(hit->id);
        plain_begin = i = after;
    }
    encode_ordinary(text.substr(plain_begin), out);
    return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) {
        QK_CHECK(id >= 0 && id < vocab_size() && !spec_.tokens[static_cast<size_t>(id)].empty(),
                 "tokenizer: id {} is not a token of this BPE vocabulary of {} ids", id,
                 vocab_size());
        out += spec_.tokens[static_cast<size_t>(id)];
    }
    return out;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view token) const {
    if (const auto it = token_ids_.find(token); it != token_ids_.end()) return it->second;
    return std::nullopt;
}

std::optional<int32_t> BpeTokenizer::document_separator() const {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "<|begin_of_text|>"})
        if (const auto id = token_id(name)) return id;
    return std::nullopt;
}

}  // namespace qk::nn::bpe
