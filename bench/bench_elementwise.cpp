// bench_elementwise — pointwise kernels in GB/s against a memcpy of the same bytes, same run.
//
//   QK_NUM_THREADS=1 ./build/bench/bench_elementwise
//
// Bytes counted: every input read once plus every output written once.
#include "bench_util.h"
#include "qk.h"

using namespace qk;

namespace {

void row(const char* name, const Shape& shape, double bytes, const std::function<void()>& fn) {
    const double seconds = bench::time_median(fn);
    const double gbps = bytes / seconds / 1e9;
    const double reference = bench::memcpy_gbps(static_cast<size_t>(bytes / 2));
    fmt::print("| {:<24} | {:<12} | {:>8.1f} | {:>8.1f} | {:>5.2f} |\n", name,
               fmt::format("{}", shape), gbps, reference, gbps / reference);
}

}  // namespace

int main() {
    fmt::print("threads: {}\n\n", num_threads());
    fmt::print("| kernel                   | shape        |     GB/s | memcpy GB/s | ratio |\n");
    fmt::print("|---|---|---:|---:|---:|\n");
    for (Shape shape : {Shape{2048, 512}, Shape{2048, 1536}, Shape{8192, 1536}}) {
        Tensor x = randn(shape), dy = randn(shape), bias = randn({shape[1]});
        const double n = static_cast<double>(x.numel()) * 4;
        row("gelu forward", shape, 2 * n, [&] { gelu(x); });
        Tensor xr = x.detach();
        xr.requires_grad_();
        Tensor y = gelu(xr);
        // The backward kernel (read dy and x, write dx), then += into the leaf's .grad (3 more).
        row("gelu backward + accumulate", shape, 6 * n,
            [&] { y.backward(dy, /*retain_graph=*/true); });
        row("add (broadcast bias)", shape, 2 * n, [&] { x + bias; });
        row("mul", shape, 3 * n, [&] { x* dy; });
    }
    return 0;
}
