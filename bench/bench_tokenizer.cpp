// Encoding speed of qknorm's tokenizers: MB/s on one thread, for a tokenizer file and a text.
//
//     build/bench/bench_tokenizer TOKENIZER TEXT [--rounds N] [--lines]
//
// Each round loads the tokenizer afresh (its piece cache empty, as a first encode finds it) and
// encodes the whole text in one call, or with --lines each line (its newline included) in a call
// of its own, as a corpus of many short documents is encoded; the best round is kept, and printed
// as one JSON line with the ids' count and a checksum, so bench/tokenizer_vs_hf.py can check both
// engines gave the same tokens.
// The comparison with Hugging Face tokenizers on the same files: bench/tokenizer_vs_hf.py.
#include <fmt/core.h>

#include <chrono>
#include <string>

#include "core/file_io.h"
#include "nn/text/tokenizer.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        fmt::print(stderr, "usage: bench_tokenizer TOKENIZER TEXT [--rounds N]\n");
        return 2;
    }
    int rounds = 5;
    bool by_lines = false;
    for (int i = 3; i < argc; ++i) {
        if (std::string(argv[i]) == "--rounds" && i + 1 < argc) rounds = std::stoi(argv[++i]);
        if (std::string(argv[i]) == "--lines") by_lines = true;
    }
    const std::string text = qk::read_regular_file(argv[2], "bench_tokenizer");
    std::vector<std::string_view> lines;
    for (size_t at = 0; at < text.size();) {
        const size_t end = std::min(text.find('\n', at), text.size() - 1) + 1;
        lines.push_back(std::string_view(text).substr(at, end - at));
        at = end;
    }
    double best = 1e30;
    size_t count = 0;
    uint64_t checksum = 0;
    for (int r = 0; r < rounds; ++r) {
        const qk::nn::Tokenizer tok = qk::nn::Tokenizer::from_file(argv[1]);
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<int32_t> ids;
        if (by_lines)
            for (std::string_view line : lines) {
                const std::vector<int32_t> part = tok.encode(line);
                ids.insert(ids.end(), part.begin(), part.end());
            }
        else
            ids = tok.encode(text);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, s);
        count = ids.size();
        checksum = 0;
        for (int32_t id : ids) checksum = checksum * 1000003u + static_cast<uint32_t>(id);
    }
    fmt::print(
        "{{\"engine\": \"qknorm\", \"tokenizer\": \"{}\", \"bytes\": {}, \"tokens\": {}, "
        "\"checksum\": {}, \"seconds\": {:.6f}, \"mb_per_s\": {:.3f}}}\n",
        argv[1], text.size(), count, checksum, best, static_cast<double>(text.size()) / 1e6 / best);
    return 0;
}
