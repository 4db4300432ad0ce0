// `qknorm tokenizer train|encode|decode` (nn/text/tokenizer.h) and `qknorm prepare` (token shards
// in llm.c's format, nn/text/prepare.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "nn/text/prepare.h"
#include "nn/text/tokenizer.h"

namespace qk::cli {

struct TokenizerArgs {
    CLI::App *train = nullptr, *encode = nullptr, *decode = nullptr;
    nn::BpeTrainOptions options;
    std::string out, tokenizer, text, file;
    std::vector<std::string> inputs;  // train: corpus files; decode: ids
    bool ordinary = false, quiet = false;
};

CLI::App* add_tokenizer_command(CLI::App& app, TokenizerArgs& args);
int run_tokenizer(const TokenizerArgs& args);

struct PrepareArgs {
    nn::PrepareOptions options;
    std::string tokenizer;
    std::vector<std::string> inputs;
    bool quiet = false;
};

CLI::App* add_prepare_command(CLI::App& app, PrepareArgs& args);
int run_prepare(PrepareArgs args);

}  // namespace qk::cli
