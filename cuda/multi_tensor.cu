// cuda/multi_tensor.cu — one launch for a whole list of tensors: the sum of squares of every
// gradient (global-norm clipping), the scaling of every gradient, AdamW's update of every
// parameter and Muon's two passes over a shape group's matrices. The CUDA twins of
// cpu::sum_of_squares, cpu::scale_all and cpu::adamw_update_all in nn/optim/optim.cpp, which run
// the same list through one parallel region, and of cpu::muon_*_all in nn/optim/muon.cpp.
//
// Why: a GPT has a dozen tensors per layer, most of them small (biases and gains of 768
// elements). One launch per tensor leaves the GPU idle between launches, and a reduction per
// tensor that returns its number to the host (`.item()`) stops the GPU once per tensor: at the
// GPT-2-124M shape that was ~130 ms of every step on an H200 where one pass over all the gradients
// at memory speed takes ~0.1 ms. PyTorch's _foreach_norm / fused AdamW and apex's
// multi_tensor_apply answer it the same way: describe every piece of work in a table, upload the
// table once, launch once.
//
// The table. The host cuts each tensor into chunks of at most kChunk elements (a tensor's last
// chunk is shorter) and lists them, each with its pointer(s) already offset to the chunk's start;
// block b of the grid takes chunk b. So a launch has as many blocks as chunks: ~3,800 for the
// 124M model's 124 M parameters, enough to fill every SM of an H100 (132) many times over, while
// a bias of 768 elements costs one small block and no launch of its own.
//
// Sum of squares, in two fixed trees (the same bits under any run order, on any GPU):
//   pass 1, one block per chunk: each thread sums its strided elements' squares (in T), the block
//           adds its threads' sums (cuda/warp_reduce.h's block_sum), thread 0 writes the chunk's
//           partial as a double;
//   pass 2, one block: the chunk partials summed in double, a strided loop then block_sum.
// One double comes back to the host: the only synchronisation of a clipping step.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include "core/float16.h"
#include "core/storage.h"
#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "nn/optim/muon.h"
#include "nn/optim/optim.h"

namespace qk::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 32768;  // elements per block: 128 per thread

template <class T>
struct Chunk {
    T* data;
    int64_t n;
};

// The chunks of `tensors`, each at most kChunk elements, in tensor order.
template <class T, class Tensors, class Offset>
std::vector<T> chunks_of(const Tensors& tensors, const std::vector<int64_t>& sizes,
                         Offset offset_by) {
    std::vector<T> table;
    for (size_t k = 0; k < sizes.size(); ++k)
        for (int64_t start = 0; start < sizes[k]; start += kChunk)
            table.push_back(offset_by(tensors[k], start, std::min(kChunk, sizes[k] - start)));
    return table;
}

// The table in device memory: scratch from the caching allocator, alive as long as the Storage
// (its reuse after that is ordered by the one stream, as every scratch buffer's is).
template <class T>
std::unique_ptr<Storage> upload(const std::vector<T>& table) {
    auto storage = std::make_unique<Storage>(table.size() * sizeof(T), Device::cuda);
    copy_to_device(storage->data(), table.data(), table.size() * sizeof(T));
    return storage;
}

// chunks: (num_chunks), grid (num_chunks), block (kThreads).   partial[b] = Σ chunk b's x²
template <class T>
__global__ void sum_of_squares_kernel(const Chunk<const T>* chunks, double* partial) {
    const Chunk<const T> c = chunks[blockIdx.x];
    T acc = 0;
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) acc += c.data[i] * c.data[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = double(acc);
}

// partial: (n), grid (1), block (kThreads).   total[0] = Σ partial
__global__ void sum_partials_kernel(const double* partial, int64_t n, double* total) {
    double acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) total[0] = acc;
}

// chunks: (num_chunks), grid (num_chunks), block (kThreads).   x *= scale
template <class T>
__global__ void scale_kernel(const Chunk<T>* chunks, T scale) {
    const Chunk<T> c = chunks[blockIdx.x];
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) c.data[i] *= scale;
}

// slots: one per chunk, grid (num_chunks), block (kThreads). The arithmetic of
// cpu::adamw_update, term for term (nn/optim/optim.cpp's header gives the math).
template <class T>
__global__ void adamw_update_all_kernel(const nn::AdamWSlot<T>* slots, T lr, T beta1, T beta2,
                                        T eps, T bias1, T bias2) {
    const nn::AdamWSlot<T> s = slots[blockIdx.x];
    for (int64_t i = threadIdx.x; i < s.n; i += blockDim.x) {
        const T gi = s.g[i];
        const T mi = beta1 * s.m[i] + (1 - beta1) * gi;       // first moment
        const T vi = beta2 * s.v[i] + (1 - beta2) * gi * gi;  // second moment
        s.m[i] = mi;
        s.v[i] = vi;
        const T m_hat = mi / bias1, v_hat = vi / bias2;  // bias corrections
        const T pi = s.p[i];
        const T updated = pi - lr * (m_hat / (dev_sqrt(v_hat) + eps) + s.decay * pi);  // decay
        s.p[i] = updated;
        if constexpr (std::is_same_v<T, float>) {  // the weight's cast copy, in the same pass
            if (s.half_dtype == DType::bf16)
                static_cast<bf16*>(s.half)[i] = float_to_bf16(updated);
            else if (s.half_dtype == DType::f16)
                static_cast<f16*>(s.half)[i] = convert_element<f16>(updated);
        }
    }
}

// slots: one per chunk, grid (num_chunks), block (kThreads). Muon's passes (nn/optim/muon.h),
// the cpu loops' arithmetic term for term.
template <class T>
__global__ void muon_momentum_all_kernel(const nn::MuonSlot<T>* slots, T mu) {
    const nn::MuonSlot<T> s = slots[blockIdx.x];
    for (int64_t i = threadIdx.x; i < s.n; i += blockDim.x) {
        const T m = mu * s.m[i] + s.g[i];  // M ← μ·M + G
        s.m[i] = m;
        s.u[i] = s.g[i] + mu * m;  // U = G + μ·M
    }
}

template <class T>
__global__ void muon_weight_all_kernel(const nn::MuonSlot<T>* slots, T keep) {
    const nn::MuonSlot<T> s = slots[blockIdx.x];
    for (int64_t i = threadIdx.x; i < s.n; i += blockDim.x) {
        const T updated = s.w[i] * keep - s.o[i] * s.rate;  // W·(1 − lr·wd) − rate·O
        s.w[i] = updated;
        if constexpr (std::is_same_v<T, float>) {  // the weight's cast copy, as AdamW's
            if (s.half_dtype == DType::bf16)
                static_cast<bf16*>(s.half)[i] = float_to_bf16(updated);
            else if (s.half_dtype == DType::f16)
                static_cast<f16*>(s.half)[i] = convert_element<f16>(updated);
        }
    }
}

// The chunks of Muon's slots, every pointer offset to the chunk's start.
template <class T>
std::vector<nn::MuonSlot<T>> muon_chunks(const std::vector<nn::MuonSlot<T>>& slots) {
    std::vector<int64_t> sizes;
    for (const nn::MuonSlot<T>& s : slots) sizes.push_back(s.n);
    return chunks_of<nn::MuonSlot<T>>(
        slots, sizes, [](const nn::MuonSlot<T>& s, int64_t start, int64_t n) {
            void* half = s.half ? static_cast<char*>(s.half) + 2 * start : nullptr;
            return nn::MuonSlot<T>{
                s.m + start, s.g + start, s.u + start, s.w + start, s.o ? s.o + start : nullptr,
                s.rate,      n,           half,        s.half_dtype};
        });
}

}  // namespace

template <class T>
void muon_momentum_all(const std::vector<nn::MuonSlot<T>>& slots, T mu) {
    const auto table = muon_chunks(slots);
    if (table.empty()) return;
    const auto device_slots = upload(table);
    int64_t elements = 0;
    for (const nn::MuonSlot<T>& s : slots) elements += s.n;
    ledger::declare_elements<T>(2 * elements, 2 * elements, 4 * elements);
    QK_LAUNCH((muon_momentum_all_kernel<T>), static_cast<unsigned>(table.size()), kThreads, 0,
              stream(), static_cast<const nn::MuonSlot<T>*>(device_slots->data()), mu);
    QK_CUDA_CHECK_LAUNCH("muon_momentum_all_kernel");
}

template <class T>
void muon_weight_all(const std::vector<nn::MuonSlot<T>>& slots, T keep) {
    const auto table = muon_chunks(slots);
    if (table.empty()) return;
    const auto device_slots = upload(table);
    int64_t elements = 0, half_elements = 0;
    for (const nn::MuonSlot<T>& s : slots) {
        elements += s.n;
        half_elements += s.half ? s.n : 0;
    }
    ledger::declare(double(sizeof(T)) * 3.0 * double(elements) + 2.0 * double(half_elements),
                    3.0 * double(elements), 0, sizeof(T) == 8);
    QK_LAUNCH((muon_weight_all_kernel<T>), static_cast<unsigned>(table.size()), kThreads, 0,
              stream(), static_cast<const nn::MuonSlot<T>*>(device_slots->data()), keep);
    QK_CUDA_CHECK_LAUNCH("muon_weight_all_kernel");
}

template <class T>
double sum_of_squares(const std::vector<const T*>& tensors, const std::vector<int64_t>& sizes) {
    const auto table =
        chunks_of<Chunk<const T>>(tensors, sizes, [](const T* x, int64_t start, int64_t n) {
            return Chunk<const T>{x + start, n};
        });
    if (table.empty()) return 0.0;
    const auto chunks = upload(table);
    const int64_t blocks = static_cast<int64_t>(table.size());
    Storage scratch(sizeof(double) * size_t(blocks + 1), Device::cuda);
    double* partial = static_cast<double*>(scratch.data());
    double* total = partial + blocks;
    const int64_t elements = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    ledger::declare(double(sizeof(T)) * double(elements) + 8.0 * double(blocks),
                    2.0 * double(elements), 0, sizeof(T) == 8);
    QK_LAUNCH((sum_of_squares_kernel<T>), static_cast<unsigned>(blocks), kThreads, 0, stream(),
              static_cast<const Chunk<const T>*>(chunks->data()), partial);
    QK_CUDA_CHECK_LAUNCH("sum_of_squares_kernel");
    ledger::declare(8.0 * double(blocks + 1), double(blocks), 0, true);  // the small combine
    QK_LAUNCH(sum_partials_kernel, 1, kThreads, 0, stream(), partial, blocks, total);
    QK_CUDA_CHECK_LAUNCH("sum_partials_kernel");
    double result = 0;
    copy_to_host(&result, total, sizeof(double));
    return result;
}

template <class T>
void scale_all(const std::vector<T*>& tensors, const std::vector<int64_t>& sizes, T scale) {
    const auto table = chunks_of<Chunk<T>>(tensors, sizes, [](T* x, int64_t start, int64_t n) {
        return Chunk<T>{x + start, n};
    });
    if (table.empty()) return;
    const auto chunks = upload(table);
    const int64_t elements = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    ledger::declare_elements<T>(elements, elements, elements);
    QK_LAUNCH((scale_kernel<T>), static_cast<unsigned>(table.size()), kThreads, 0, stream(),
              static_cast<const Chunk<T>*>(chunks->data()), scale);
    QK_CUDA_CHECK_LAUNCH("scale_kernel");
}

template <class T>
void adamw_update_all(const std::vector<nn::AdamWSlot<T>>& slots, T lr, T beta1, T beta2, T eps,
                      T bias1, T bias2) {
    std::vector<int64_t> sizes;
    for (const nn::AdamWSlot<T>& s : slots) sizes.push_back(s.n);
    const auto table = chunks_of<nn::AdamWSlot<T>>(
        slots, sizes, [](const nn::AdamWSlot<T>& s, int64_t start, int64_t n) {
            void* half = s.half ? static_cast<char*>(s.half) + 2 * start : nullptr;
            return nn::AdamWSlot<T>{s.p + start, s.g + start, s.m + start, s.v + start,
                                    n,           s.decay,     half,        s.half_dtype};
        });
    if (table.empty()) return;
    const auto device_slots = upload(table);
    const int64_t elements = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    int64_t half_elements = 0;  // the cast copies written beside their weights, 2 bytes each
    for (const nn::AdamWSlot<T>& s : slots) half_elements += s.half ? s.n : 0;
    ledger::declare(double(sizeof(T)) * 7.0 * double(elements) + 2.0 * double(half_elements),
                    12.0 * double(elements), 0, sizeof(T) == 8);
    QK_LAUNCH((adamw_update_all_kernel<T>), static_cast<unsigned>(table.size()), kThreads, 0,
              stream(), static_cast<const nn::AdamWSlot<T>*>(device_slots->data()), lr, beta1,
              beta2, eps, bias1, bias2);
    QK_CUDA_CHECK_LAUNCH("adamw_update_all_kernel");
}

template double sum_of_squares<float>(const std::vector<const float*>&,
                                      const std::vector<int64_t>&);
template double sum_of_squares<double>(const std::vector<const double*>&,
                                       const std::vector<int64_t>&);
template void scale_all<float>(const std::vector<float*>&, const std::vector<int64_t>&, float);
template void scale_all<double>(const std::vector<double*>&, const std::vector<int64_t>&, double);
template void adamw_update_all<float>(const std::vector<nn::AdamWSlot<float>>&, float, float, float,
                                      float, float, float);
template void adamw_update_all<double>(const std::vector<nn::AdamWSlot<double>>&, double, double,
                                       double, double, double, double);
template void muon_momentum_all<float>(const std::vector<nn::MuonSlot<float>>&, float);
template void muon_momentum_all<double>(const std::vector<nn::MuonSlot<double>>&, double);
template void muon_weight_all<float>(const std::vector<nn::MuonSlot<float>>&, float);
template void muon_weight_all<double>(const std::vector<nn::MuonSlot<double>>&, double);

}  // namespace qk::cuda
