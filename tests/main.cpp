// The doctest main of every C++ suite. A suite whose every test needs a CUDA device (meson sets
// QK_NEEDS_CUDA for the cuda_* suites) exits with 77 when there is none, so that meson reports
// SKIP rather than OK: OK always means the tests ran (the nvcc build on a machine without a GPU).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "cuda/runtime.h"

int main(int argc, char** argv) {
    doctest::Context context(argc, argv);
    const int status = context.run();
    if (context.shouldExit() || status != 0) return status;
    const char* needs_cuda = std::getenv("QK_NEEDS_CUDA");
    if (needs_cuda && needs_cuda[0] == '1' && !qk::cuda::device_available()) {
        std::printf("no CUDA device (%s): every test of this suite needs one, so it is skipped\n",
                    qk::cuda::backend_description());
        return 77;  // meson's exit status for a skipped test
    }
    return 0;
}
