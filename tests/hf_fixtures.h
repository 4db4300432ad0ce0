// The Hugging Face fixtures of tests/data/hf (tools/make_hf_fixtures.py): tiny random GPT-2,
// Qwen3, OLMo 2 and Gemma 3 models that transformers built and saved. Used by tests/test_hf.cpp
// and tests/test_fine_tune.cpp; meson test passes their directory as HF_FIXTURES.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.h"

namespace qk::test {

inline const char* const kFamilies[] = {"gpt2", "qwen3", "olmo2", "gemma3"};

inline std::string fixture(const std::string& family) {
    const char* root = std::getenv("HF_FIXTURES");
    REQUIRE_MESSAGE(root != nullptr, "HF_FIXTURES (tests/data/hf) is set by meson test");
    return std::string(root) + "/" + family;
}

// A scratch copy of a fixture directory, removed at the end of the scope.
struct ScratchDir : TempDir {
    explicit ScratchDir(const std::string& family) : TempDir("hf_" + family) {
        std::filesystem::copy(fixture(family), path);
    }
    std::string str() const { return path.string(); }
    nlohmann::json read(const std::string& file) const {
        std::ifstream f(path / file);
        return nlohmann::json::parse(f);
    }
    void write(const std::string& file, const nlohmann::json& j) const {
        std::ofstream(path / file) << j;
    }
};

}  // namespace qk::test
