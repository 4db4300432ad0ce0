// Embedding: a table lookup, the first layer of a language model.
//
// Forward: with ids flattened to N positions,
//     y[n, :] = weight[ids[n], :]                         y: (*ids.shape, C), weight: (V, C)
// Saved: the ids (int32), nothing else: the backward does not need weight's values.
//
// Backward: y[n, c] depends on exactly one weight element, weight[ids[n], c], with slope 1, so
//     dweight[v, c] = Σ_{n : ids[n] = v} dy[n, c]        (scatter-add; unseen rows get 0)
// A token that appears k times in the batch collects k rows of dy. ids are integers, so they have
// no gradient.
//
// Threads: the forward writes distinct rows of y and is split by rows. The backward cannot be
// split by rows of dy: two positions with the same id would add into the same dweight row at the
// same time (a data race, lost updates). It is split by columns instead: each thread owns a band
// of columns of every dweight row and walks all N positions in order, so no element has two
// writers, no atomics are needed, and every dweight element sums its terms in the same order
// (n = 0, 1, ...) whatever the thread count: the gradient is bitwise reproducible. (The CUDA
// twin, cuda/embedding.cu, scatters with atomicAdd instead: see there for what that costs.)
#include "ops/embedding.h"

#include <algorithm>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/threading.h"
#include "ops/on_device.h"

namespace qk {

namespace cpu {

// Below this many copied elements a parallel region costs more than it saves.
constexpr int64_t kParallelWork = 1 << 15;

// y: (N, C); weight: (V, C); ids: (N), every id already checked to be in [0, V).
template <class T>
void embedding_forward(T* y, const T* weight, const int32_t* ids, int64_t N, int64_t C) {
    auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n)
            std::copy_n(weight + int64_t{ids[n]} * C, C, y + n * C);
    };
    parallel_for(N, rows, N * C >= kParallelWork);
}

// dweight: (V, C), zero-initialised; dy: (N, C); ids: (N).   dweight[ids[n], :] += dy[n, :]
// Each thread takes the columns [c0, c1) of every row (see the header for why columns). Band
// widths are whole 64-byte cache lines, so when rows start on a line (C a multiple of 16 floats)
// no two threads write to one line. With one thread this is the plain serial loop.
template <class T>
void embedding_backward(T* dweight, const T* dy, const int32_t* ids, int64_t N, int64_t C) {
    const int threads = N * C >= kParallelWork ? num_threads() : 1;
    auto band = [&](int t) {
        constexpr int64_t kLine = 64 / sizeof(T);
        const int64_t width = ((C + threads - 1) / threads + kLine - 1) / kLine * kLine;
        const int64_t c0 = std::min(C, t * width), c1 = std::min(C, c0 + width);
        for (int64_t n = 0; n < N; ++n) {
            T* dst = dweight + int64_t{ids[n]} * C;
            const T* src = dy + n * C;
            for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
        }
    };
    parallel_run(threads, band);
}

}  // namespace cpu

namespace {

// The multi-index of flat position `flat` in a row-major `shape`, e.g. [1, 3].
Shape unravel(int64_t flat, const Shape& shape) {
    Shape index(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
        index[d] = flat % shape[d];
        flat /= shape[d];
    }
    return index;
}

// Every id must be a row of weight: an out-of-range id would read or write outside the table.
// Checked once, serially, before the kernels run (a parallel loop cannot throw).
void check_ids_in_range(const Tensor& ids, int64_t V, const Shape& weight_shape) {
    const int32_t* p = ids.data<int32_t>();
    for (int64_t n = 0, N = ids.numel(); n < N; ++n)
        QK_CHECK(p[n] >= 0 && p[n] < V,
                 "embedding: ids{} = {} is out of range for weight of shape {} (expected 0 <= id "
                 "< {}; ids has shape {})",
                 unravel(n, ids.shape()), p[n], weight_shape, V, ids.shape());
}

// dweight (V, C) from dy (*ids.shape, C).
Tensor embedding_backward(const Tensor& dy_in, const Tensor& ids, int64_t V, int64_t C) {
    Tensor dy = dy_in.contiguous();
    Tensor dweight = zeros({V, C}, dy.dtype(), dy.device());
    on_device(
        "embedding backward", dy.device(), dy.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::embedding_backward(dweight.data<T>(), dy.data<T>(), ids.data<int32_t>(),
                                    ids.numel(), C);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::embedding_backward(dweight.data<T>(), dy.data<T>(), ids.data<int32_t>(),
                                     ids.numel(), C);
        });
    return dweight;
}

}  // namespace

Tensor embedding(const Tensor& weight_in, const Tensor& ids_in) {
    QK_CHECK(weight_in.dim() == 2, "embedding: weight must be 2-D (V, C), got shape {}",
             weight_in.shape());
    QK_CHECK(is_compute_dtype(weight_in.dtype()),
             "embedding: weight must be float32 or float64, got {} of shape {}", weight_in.dtype(),
             weight_in.shape());
    QK_CHECK(ids_in.dtype() == kI32,
             "embedding: ids must be int32 token ids, got {} of shape {} (expected int32 ids in "
             "[0, {}) for weight of shape {})",
             ids_in.dtype(), ids_in.shape(), weight_in.size(0), weight_in.shape());
    // ids on the cpu with a cuda weight are accepted (and copied over): batches come from the
    // host data loader, and the range check below reads the ids on the host anyway. The reverse
    // (cuda ids, cpu weight) would bring ids back for nothing: the caller should move the weight.
    QK_CHECK(weight_in.device() == ids_in.device() || ids_in.device() == Device::cpu,
             "embedding: weight {} is on {} but ids {} are on {} (expected ids on the weight's "
             "device or on the cpu)",
             weight_in.shape(), weight_in.device(), ids_in.shape(), ids_in.device());
    const int64_t V = weight_in.size(0), C = weight_in.size(1);
    const Tensor weight = autograd::contiguous_input(weight_in);
    // A private copy (N ints, 1/C of y's size): the backward reads the ids later, and a caller
    // refilling its batch buffer before backward() must not change the gradient.
    // (to() already copies when the devices differ.)
    Tensor ids = ids_in.device() == weight.device() ? ids_in.clone() : ids_in.to(weight.device());
    Shape out_shape = ids.shape();
    out_shape.push_back(C);
    Tensor y = Tensor::empty(out_shape, weight.dtype(), weight.device());
    switch (weight.device()) {
        case Device::cpu:
            check_ids_in_range(ids, V, weight.shape());
            dispatch_float(weight.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cpu::embedding_forward(y.data<T>(), weight.data<T>(), ids.data<int32_t>(),
                                       ids.numel(), C);
            });
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            // Checked on the host, as on the cpu (a kernel could not throw): cuda ids bring N
            // ints back, cpu ids are checked where they are.
            check_ids_in_range(ids_in.to(Device::cpu), V, weight.shape());
            dispatch_float(weight.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cuda::embedding_forward(y.data<T>(), weight.data<T>(), ids.data<int32_t>(),
                                        ids.numel(), C);
            });
#else
            throw_built_without_cuda("embedding");
#endif
            break;
    }
    return autograd::record("embedding", y, {weight_in},
                            [ids = autograd::saved(ids), V, C](const Tensor& dy) {
                                return std::vector<Tensor>{embedding_backward(dy, ids, V, C)};
                            });
}

}  // namespace qk
