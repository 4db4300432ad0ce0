// Re-exports Hugging Face model directories through qknorm, for tools/check_hf_export.py:
//     build/hf_reexport IN_DIR OUT_DIR FAMILY...
// loads IN_DIR/FAMILY with nn::load_hf_model and writes OUT_DIR/FAMILY with nn::save_hf_model.
#include <fmt/core.h>

#include "nn/hf/hf.h"

int main(int argc, char** argv) {
    if (argc < 4) {
        fmt::print(stderr, "usage: hf_reexport IN_DIR OUT_DIR FAMILY...\n");
        return 2;
    }
    try {
        for (int i = 3; i < argc; ++i) {
            auto model = qk::nn::load_hf_model(fmt::format("{}/{}", argv[1], argv[i]));
            qk::nn::save_hf_model(*model, fmt::format("{}/{}", argv[2], argv[i]));
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "hf_reexport: {}\n", e.what());
        return 1;
    }
    return 0;
}
