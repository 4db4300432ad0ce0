// The CUDA backend when the library is built without CUDA: every entry point says so.
#include "core/storage.h"

namespace qk {

namespace {
void* no_cuda_allocate(std::size_t) {
    throw Error("cuda: qknorm was built without CUDA support (reconfigure with -Dcuda=enabled)");
}
void no_cuda_release(void*, std::size_t) {}
}  // namespace

const Allocator& cuda_allocator() {
    static const Allocator stub{no_cuda_allocate, no_cuda_release};
    return stub;
}

}  // namespace qk
