// Byte-level BPE training (nn/text/tokenizer.h, train_bpe), with the bookkeeping that makes it
// fast:
//
//   words   every distinct piece of the corpus (GPT-2's pre-tokenizer), as symbol ids, with its
//           count; merging never crosses pieces, so a word's count carries every occurrence.
//   pairs   count(a, b) = sum over words w of count(w) * (occurrences of a b in w), and
//           where(a, b) = the words that may hold a b.
//   queue   a max-heap of (count, pair), ties to the smaller pair (left id, then right id).
//
// Each merge pops the best pair: if its count is stale (a later merge took some of its
// occurrences) it goes back with the current one; otherwise a new symbol ab takes the next id,
// and each word in where(a, b) is rewritten left to right (a b -> ab, no overlap: "aaa" -> "aa a")
// with its pair counts taken out before and put back after. Counts only fall, except for pairs
// containing the new symbol, which are pushed then. tools/bpe_reference.py is the same rule with
// every pair recounted before every merge; the tests check both give Hugging Face's merges.

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "nn/text/bpe.h"

namespace qk::nn {

namespace {

using Pair = std::pair<int32_t, int32_t>;

struct PairHash {
    size_t operator()(const Pair& p) const {
        return std::hash<uint64_t>()((static_cast<uint64_t>(p.first) << 32) |
                                     static_cast<uint32_t>(p.second));
    }
};

struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
};

// The distinct pieces of the texts with their counts; special tokens written in a text are cut
// out first, as the encoder does.
std::unordered_map<std::string, int64_t> count_words(const std::vector<std::string>& texts,
                                                     const BpeTrainOptions& options) {
    std::vector<bpe::SplitStep> steps{{std::make_shared<bpe::Regex>(bpe::kGpt2Pattern)}};
    std::unordered_map<std::string, int64_t> counts;
    std::vector<std::string_view> pieces;
    int64_t total = 0, done = 0;
    for (const std::string& t : texts) total += static_cast<int64_t>(t.size());
    for (const std::string& text : texts) {
        // Chunks of about 1 MB, cut after a newline, so that progress moves.
        for (size_t begin = 0; begin < text.size();) {
            size_t end = std::min(text.size(), begin + (size_t{1} << 20));
            const size_t newline = text.find('\n', end);
            end = newline == std::string::npos ? text.size() : newline + 1;
            std::string_view chunk(text.data() + begin, end - begin);
            size_t plain = 0;
            auto add = [&](std::string_view plain_text) {
                bpe::pre_tokenize(steps, plain_text, pieces);
                for (std::string_view p : pieces) ++counts[std::string(p)];
            };
            for (size_t i = 0; i < chunk.size(); ++i)
                for (const std::string& special : options.special_tokens)
                    if (chunk.compare(i, special.size(), special) == 0) {
                        add(chunk.substr(plain, i - plain));
                        plain = i + special.size();
                        i = plain - 1;
                        break;
                    }
            add(chunk.substr(plain));
            done += static_cast<int64_t>(end - begin);
            if (options.progress) options.progress("read", done, total);
            begin = end;
        }
    }
    return counts;
}

}  // namespace

Tokenizer train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& options) {
    const int64_t specials = static_cast<int64_t>(options.special_tokens.size());
    QK_CHECK(options.vocab_size >= 256 + specials && options.vocab_size <= (int64_t{1} << 22),
             "tokenizer train: --vocab-size {} must hold the 256 bytes and the {} special "
             "token(s), {} in all, and be at most {}",
             options.vocab_size, specials, 256 + specials, int64_t{1} << 22);
    int64_t corpus_bytes = 0;
    for (const std::string& t : texts) corpus_bytes += static_cast<int64_t>(t.size());
    QK_CHECK(corpus_bytes > 0, "tokenizer train: the corpus is empty (0 bytes)");
    // tokenizer.json maps each string to one id: a special written twice, or equal to a byte's
    // token, would be read back (by Hugging Face's tokenizers too) with other ids than ours.
    const auto& byte_tokens = bpe::byte_stand_ins();
    for (size_t i = 0; i < options.special_tokens.size(); ++i) {
        const std::string& s = options.special_tokens[i];
        QK_CHECK(!s.empty(), "tokenizer train: a special token is empty");
        for (size_t j = 0; j < i; ++j)
            QK_CHECK(options.special_tokens[j] != s,
                     "tokenizer train: the special token '{}' is given twice", s);
        const auto byte = std::find(byte_tokens.begin(), byte_tokens.end(), s);
        QK_CHECK(byte == byte_tokens.end(),
                 "tokenizer train: the special token '{}' is the token of byte {} in "
                 "tokenizer.json's vocabulary; one string holds one id there: choose another",
                 s, byte - byte_tokens.begin());
    }

    // Ids: specials, then the bytes in the order of their stand-in characters (code points).
    std::vector<std::string> tokens(options.special_tokens.begin(), options.special_tokens.end());
    std::array<int32_t, 256> byte_id{};
    std::vector<int> bytes(256);
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = b;
    // UTF-8 strings compare (as std::string does, byte by byte unsigned) in code point order.
    const auto& stand_ins = bpe::byte_stand_ins();
    std::sort(bytes.begin(), bytes.end(), [&](int a, int b) {
        return stand_ins[static_cast<size_t>(a)] < stand_ins[static_cast<size_t>(b)];
    });
    for (int b : bytes) {
        byte_id[static_cast<size_t>(b)] = static_cast<int32_t>(tokens.size());
        tokens.emplace_back(1, static_cast<char>(b));
    }

    std::vector<Word> words;
    for (auto& [piece, count] : count_words(texts, options)) {
        Word w{{}, count};
        for (unsigned char c : piece) w.symbols.push_back(byte_id[c]);
        words.push_back(std::move(w));
    }
    // Hash-map order differs between libraries: sort, so that the result cannot depend on it.
    std::sort(words.begin(), words.end(),
              [](const Word& a, const Word& b) { return a.symbols < b.symbols; });

    std::unordered_map<Pair, int64_t, PairHash> pair_count;
    std::unordered_map<Pair, std::unordered_set<size_t>, PairHash> where;
    for (size_t w = 0; w < words.size(); ++w)
        for (size_t i = 0; i + 1 < words[w].symbols.size(); ++i) {
            const Pair p{words[w].symbols[i], words[w].symbols[i + 1]};
            pair_count[p] += words[w].count;
            where[p].insert(w);
        }
    struct Entry {
        int64_t count;
        Pair pair;
        bool operator<(const Entry& o) const {  // the heap's top is the largest
            return count != o.count ? count < o.count : pair > o.pair;
        }
    };
    std::priority_queue<Entry> queue;
    for (const auto& [p, c] : pair_count) queue.push({c, p});

    std::vector<Pair> merges;
    const int64_t wanted = options.vocab_size - static_cast<int64_t>(tokens.size());
    while (static_cast<int64_t>(merges.size()) < wanted && !queue.empty()) {
        Entry top = queue.top();
        queue.pop();
        const int64_t current = pair_count[top.pair];
        if (top.count != current) {  // stale: back in with its current count
            if (current > 0) queue.push({current, top.pair});
            continue;
        }
        if (top.count < 1 || top.count < options.min_frequency) break;
        const auto merged = static_cast<int32_t>(tokens.size());
        tokens.push_back(tokens[static_cast<size_t>(top.pair.first)] +
                         tokens[static_cast<size_t>(top.pair.second)]);
        merges.push_back(top.pair);
        std::unordered_set<Pair, PairHash> grown;
        for (size_t w : where[top.pair]) {
            Word& word = words[w];
            auto& s = word.symbols;
            for (size_t i = 0; i + 1 < s.size(); ++i) pair_count[{s[i], s[i + 1]}] -= word.count;
            std::vector<int32_t> rewritten;
            for (size_t i = 0; i < s.size(); ++i) {
                if (i + 1 < s.size() && s[i] == top.pair.first && s[i + 1] == top.pair.second) {
                    rewritten.push_back(merged);
                    ++i;
                } else {
                    rewritten.push_back(s[i]);
                }
            }
            s.swap(rewritten);
            for (size_t i = 0; i + 1 < s.size(); ++i) {
                const Pair p{s[i], s[i + 1]};
                pair_count[p] += word.count;
                if (p.first == merged || p.second == merged) {
                    where[p].insert(w);
                    grown.insert(p);
                }
            }
        }
        where.erase(top.pair);
        for (const Pair& p : grown) queue.push({pair_count[p], p});
        if (options.progress)
            options.progress("merge", static_cast<int64_t>(merges.size()), wanted);
    }

    // As a tokenizer.json: GPT-2's ByteLevel pre-tokenizer (with its regex) and decoder.
    std::vector<std::string> keys;
    std::unordered_set<std::string> seen;
    for (size_t id = 0; id < tokens.size(); ++id) {
        keys.push_back(id < options.special_tokens.size() ? tokens[id]
                                                          : bpe::to_stand_ins(tokens[id]));
        QK_CHECK(seen.insert(keys.back()).second,
                 "tokenizer train: the special token '{}' is also a merged token of the corpus; "
                 "one string holds one id in tokenizer.json: choose another special",
                 keys.back());
    }
    std::vector<std::pair<std::string, std::string>> merge_keys;
    for (const Pair& p : merges)
        merge_keys.emplace_back(bpe::to_stand_ins(tokens[static_cast<size_t>(p.first)]),
                                bpe::to_stand_ins(tokens[static_cast<size_t>(p.second)]));
    const std::string file = bpe::byte_level_tokenizer_json(keys, options.special_tokens.size(),
                                                            merge_keys, /*use_regex=*/true);
    return Tokenizer(
        std::make_shared<bpe::BpeTokenizer>(bpe::parse_tokenizer_json(file, "(trained)")));
}

}  // namespace qk::nn
