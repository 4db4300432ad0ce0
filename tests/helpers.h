// Shared test helpers: building tensors, comparing them, and checking error messages.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "qk.h"

namespace qk::test {

// A float64 leaf that requires grad, drawn from a fixed seed.
inline Tensor leaf(const Shape& shape, uint64_t seed, double scale = 1.0) {
    Generator gen(seed);
    Tensor t = normal(shape, 0, scale, kF64, gen);
    t.requires_grad_();
    return t;
}

// Sets the thread count for one scope, and restores it even when a CHECK fails.
struct ThreadCount {
    int saved = num_threads();
    explicit ThreadCount(int n) { set_num_threads(n); }
    ~ThreadCount() { set_num_threads(saved); }
};

// max |a - b| over all elements (shapes must match).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
    REQUIRE(a.shape() == b.shape());
    auto va = a.to_vector<double>(), vb = b.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < va.size(); ++i) {
        // NaN where the other has a number is the worst difference (std::max would drop it);
        // NaN in both counts as equal.
        if (std::isnan(va[i]) != std::isnan(vb[i])) return INFINITY;
        if (!std::isnan(va[i])) worst = std::max(worst, std::abs(va[i] - vb[i]));
    }
    return worst;
}

// max |a − b| / max |b|: the error relative to b's scale (shapes must match).
inline double relative_error(const Tensor& a, const Tensor& b) {
    REQUIRE(a.shape() == b.shape());
    const double scale = max(abs(b.to(kF64))).item();
    return max(abs(a.to(kF64) - b.to(kF64))).item() / std::max(scale, 1e-30);
}

// The message of the qk::Error that f throws, or "(no error)".
template <typename F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const qk::Error& e) {
        return e.what();
    }
    return "(no error)";
}

// True when f throws qk::Error whose message contains every one of the fragments.
template <typename F>
bool throws_with(F&& f, std::initializer_list<std::string> fragments) {
    try {
        f();
    } catch (const qk::Error& e) {
        std::string what = e.what();
        for (const auto& frag : fragments)
            if (what.find(frag) == std::string::npos) {
                MESSAGE("error message '" << what << "' lacks '" << frag << "'");
                return false;
            }
        return true;
    }
    return false;
}

// A fresh directory under /tmp, removed with everything in it at the end of the test.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& tag) {
        path = std::filesystem::temp_directory_path() /
               ("qk_test_" + tag + "_" + std::to_string(::getpid()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// Writes bytes to dir/name; returns the path.
inline std::string write_file(const TempDir& dir, const std::string& name,
                              const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
}

// About 6 KB of text with some structure to learn, written into dir; returns its path.
inline std::string write_corpus(const TempDir& dir) {
    const char* lines[] = {"First Citizen:\nBefore we proceed any further, hear me speak.\n\n",
                           "All:\nSpeak, speak.\n\n",
                           "First Citizen:\nYou are all resolved rather to die than to famish?\n\n",
                           "All:\nResolved. resolved.\n\n"};
    std::string text;
    for (int i = 0; text.size() < 6000; ++i) text += lines[(i * 7 + i / 3) % 4];
    const std::string path = dir / "corpus.txt";
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

#define CHECK_GRADCHECK(...)                            \
    do {                                                \
        auto gc_result_ = ::qk::gradcheck(__VA_ARGS__); \
        INFO(gc_result_.report);                        \
        CHECK(gc_result_.ok);                           \
    } while (0)

}  // namespace qk::test
