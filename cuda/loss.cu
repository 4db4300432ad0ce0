// CUDA cross-entropy: fused log-softmax + negative log-likelihood with int32 targets.
// Twin of ops/loss.cpp (cpu::cross_entropy_forward / cpu::cross_entropy_backward), where the math
// (loss_i = lse_i − x_{i,t_i}; dx = (softmax − onehot) · dL / n_valid) is derived.
//
// Work split:
//   forward   one block of 256 threads per row of logits (N blocks; fewer for rows under 256).
//             Vocabulary rows are long (65 to 50257 logits) and few (N = B·T), so a whole block
//             shares a row: each thread strides over the row by the block's size, then block_max
//             and block_sum (warp shuffles + one shared slot per warp) combine the threads.
//             Writes lse_i and loss_i (double).
//   mean      one block: sums the N row losses in a fixed tree (threads stride over rows, then
//             block_sum), divides by n_valid and writes the scalar loss on the device (with a
//             z-loss, the lse² too, the cross-entropy alone beside the total). A fixed
//             order, not float atomics, so that the loss does not depend on block order.
//   backward  elementwise, one thread per logit (a flat grid over N·V): dx_ij needs only x_ij,
//             lse_i, t_i and the upstream scalar, read on the device (no host round trip).
//   linear_cross_entropy's (ops/loss.h):
//   forward with the gradient  the forward's block per row, then a third pass over the row (from
//             cache) writes dx for the announced upstream gradient, rounded, padded with zeros.
//   fixup     up to 264 blocks striding over rows; each reads the upstream scalar and, when it
//             is the one the gradient was written for (in training, the announced one), returns
//             at once.
// Targets are checked (range, ignore_index, n_valid > 0) on the host by the op, before launch.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/storage.h"
#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "ops/loss.h"

namespace qk::cuda {

namespace {

constexpr int kRowThreads = 256;
// A row's block: 256 threads, or fewer for a short row (V = 65: 96), whole warps; threads that
// would find no logit are not launched.
unsigned row_threads(int64_t V) {
    return unsigned(std::clamp<int64_t>((V + kWarp - 1) / kWarp * kWarp, kWarp, kRowThreads));
}
constexpr int kMeanThreads = 256;
constexpr int kBackwardThreads = 256;
// The fixup's grid: two blocks an SM of an H100. Rare work (a backward whose upstream gradient
// was not the one announced), and otherwise a launch whose every thread exits at once.
constexpr int64_t kFixupBlocks = 264;

// m + log Σ exp(x − m), m = max x, over one row of V logits, the block's threads striding over
// it; every thread gets it. The two passes read the row twice (the second from cache).
template <class T>
__device__ T block_row_lse(const T* xr, int64_t V) {
    T m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
    m = block_max(m);
    T s = 0;  // Σ exp(x − m): every term <= 1
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += dev_exp(xr[j] - m);
    s = block_sum(s);
    return m + dev_log(s);
}

// dx_ij = (softmax_ij − [j == target]) · scale, scale = dL / n_valid: the backward's one formula,
// which linear_cross_entropy's forward and its fixup also compute, so that all three give the
// same bits.
template <class T>
__device__ __forceinline__ T logit_gradient(T x, T row_lse, bool is_target, T scale) {
    //      [term "p"]                   [term "onehot"]
    return (dev_exp(x - row_lse) - (is_target ? T(1) : T(0))) * scale;
}

// linear_cross_entropy's gradient of one logit for the upstream gradient u: the cross-entropy's
// term on valid rows (scale = u / n_valid) plus, with a z-loss z·mean_N(lse²) over all N rows, the
// z-loss's (2z/N)·lse_i·p_ij·u on every row, ignored ones too (z_row = u·(2z/N)·lse_i). Without a
// z-loss (z_row = 0) exactly logit_gradient; with one, the two terms rounded apart and then added
// (no fused multiply-add: the emulator's bits are the device's).
template <class T>
__device__ __forceinline__ T head_gradient(T x, T row_lse, bool valid, bool is_target, T scale,
                                           T z_row) {
    if (z_row == T(0)) return valid ? logit_gradient(x, row_lse, is_target, scale) : T(0);
    const T p = dev_exp(x - row_lse);
    const T ce = valid ? (p - (is_target ? T(1) : T(0))) * scale : T(0);
    return dev_add_unfused(ce, p * z_row);
}

// lse: (N) out, 0 on ignored rows; loss: (N) out, lse_i − x_{i,t_i}, 0 on ignored rows;
// x: (N, V), rows x_ld apart; t: (N).
template <class T>
__global__ void cross_entropy_forward_kernel(T* lse, double* loss, const T* x, const int32_t* t,
                                             int64_t V, int32_t ignore_index, int64_t x_ld) {
    const int64_t i = blockIdx.x;
    const int32_t target = t[i];
    if (target == ignore_index) {  // the same for the whole block: no barrier is skipped by some
        if (threadIdx.x == 0) {
            lse[i] = 0;
            loss[i] = 0;
        }
        return;
    }
    const T* xr = x + i * x_ld;
    const T row_lse = block_row_lse(xr, V);
    if (threadIdx.x == 0) {
        lse[i] = row_lse;
        loss[i] = double(row_lse) - double(xr[target]);
    }
}

// The forward above, and then, from the same row, its gradient for an upstream gradient known in
// advance (linear_cross_entropy): g: (N, g_ld) out, the gradient rounded (bf16 or fp16 bits), zero
// in columns V..g_ld (a padded head's) and on ignored rows; scale = dL / n_valid.
// g_upstream: () out, the upstream gradient g is written for (`assumed`; the fixup reads it).
// With a z-loss (zrow: (N) out, lse_i², in double; z_factor = u·(2z/N)), ignored rows get their
// lse and the z-loss's gradient too; without one, zrow is null and z_factor 0.
template <class T>
__global__ void cross_entropy_forward_gradient_kernel(T* lse, double* loss, double* zrow,
                                                      uint16_t* g, T* g_upstream, const T* x,
                                                      const int32_t* t, int64_t V,
                                                      int32_t ignore_index, int64_t x_ld,
                                                      int64_t g_ld, T assumed, T scale, T z_factor,
                                                      bool half_is_bf16) {
    const int64_t i = blockIdx.x;
    if (i == 0 && threadIdx.x == 0) *g_upstream = assumed;
    const int32_t target = t[i];
    const bool valid = target != ignore_index;
    uint16_t* gr = g + i * g_ld;
    if (!valid && !zrow) {  // the same for the whole block: no barrier is skipped by some
        for (int64_t j = threadIdx.x; j < g_ld; j += blockDim.x) gr[j] = 0;
        if (threadIdx.x == 0) lse[i] = 0, loss[i] = 0;
        return;
    }
    const T* xr = x + i * x_ld;
    const T row_lse = block_row_lse(xr, V);
    if (threadIdx.x == 0) {
        lse[i] = row_lse;
        loss[i] = valid ? double(row_lse) - double(xr[target]) : 0.0;
        if (zrow) zrow[i] = double(row_lse) * double(row_lse);
    }
    const T z_row = z_factor * row_lse;
    for (int64_t j = threadIdx.x; j < g_ld; j += blockDim.x) {
        const T value =
            j < V ? head_gradient(xr[j], row_lse, valid, j == target, scale, z_row) : T(0);
        store_half(gr, j, value, half_is_bf16);
    }
}

// The upstream gradient the backward got, dloss, against the one g holds the gradient for
// (g_upstream: the forward's assumption, or the last fixup's): equal (to the bit) and this kernel
// does nothing; else it rewrites g from the logits, as the forward gradient kernel would have
// with dloss, and its last block to finish records dloss in g_upstream (every block has read it
// by then), so that a second backward (retain_graph) compares with what g now holds. Grid (1,
// blocks): block y strides over rows. counters: one (arrived_last). Arguments as above.
template <class T>
__global__ void cross_entropy_gradient_fixup_kernel(uint16_t* g, T* g_upstream, unsigned* counters,
                                                    const T* x, const int32_t* t, const T* lse,
                                                    const T* dloss, int64_t N, int64_t V,
                                                    int32_t ignore_index, T inv_n_valid, T z_unit,
                                                    int64_t x_ld, int64_t g_ld, bool half_is_bf16) {
    const T upstream = dloss[0], held = *g_upstream;
    if (upstream == held && std::signbit(upstream) == std::signbit(held)) return;  // every block
    const T scale = upstream * inv_n_valid, z_factor = upstream * z_unit;
    for (int64_t i = blockIdx.y; i < N; i += gridDim.y) {
        const bool valid = t[i] != ignore_index;
        if (!valid && z_unit == T(0)) continue;  // zero whatever the scale
        const T* xr = x + i * x_ld;
        const T z_row = z_factor * lse[i];
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
            store_half(g + i * g_ld, j,
                       head_gradient(xr[j], lse[i], valid, j == t[i], scale, z_row), half_is_bf16);
    }
    if (arrived_last(counters) && threadIdx.x == 0) *g_upstream = upstream;
}

// out: () the mean loss, as T; loss: (N) per-row losses. With a z-loss (zrow: (N), lse_i², or
// null): out is the mean plus z · Σ zrow / N, and ce: () gets the mean alone. One block, the sums
// in fixed trees, in double.
template <class T>
__global__ void cross_entropy_mean_kernel(T* out, T* ce, const double* loss, const double* zrow,
                                          int64_t N, double n_valid, double z) {
    double acc = 0, zacc = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += loss[i];
    acc = block_sum(acc);
    if (zrow) {  // the same for the whole block
        for (int64_t i = threadIdx.x; i < N; i += blockDim.x) zacc += zrow[i];
        zacc = block_sum(zacc);
    }
    if (threadIdx.x != 0) return;
    out[0] = T(zrow ? acc / n_valid + z * (zacc / double(N)) : acc / n_valid);
    if (zrow) ce[0] = T(acc / n_valid);
}

// dx: (N, V) out; x: (N, V), rows x_ld apart; t: (N); lse: (N); dloss: () the upstream gradient;
// dx_half: null or (N, V) out, dx rounded (bf16 or fp16 bits) for the head's backward GEMMs.
template <class T>
__global__ void cross_entropy_backward_kernel(T* dx, const T* x, const int32_t* t, const T* lse,
                                              const T* dloss, int64_t N, int64_t V,
                                              int32_t ignore_index, T inv_n_valid, int64_t x_ld,
                                              uint16_t* dx_half, bool half_is_bf16) {
    const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (k >= N * V) return;
    const int64_t i = k / V, j = k - i * V;
    const int32_t target = t[i];
    T value = 0;
    if (target != ignore_index) {
        const T scale = dloss[0] * inv_n_valid;  // dL / n_valid
        value = logit_gradient(x[i * x_ld + j], lse[i], j == target, scale);
    }
    dx[k] = value;
    store_half(dx_half, k, value, half_is_bf16);
}

// The mean of the row losses (with a z-loss, and of lse², and ce), written on the device (one
// block, a fixed order).
template <class T>
void launch_mean(T* loss_out, const double* row_loss, int64_t N, int64_t n_valid,
                 const double* zrow = nullptr, double z_loss = 0, T* ce_out = nullptr) {
    ledger::declare((zrow ? 16.0 : 8.0) * double(N), (zrow ? 2.0 : 1.0) * double(N), 0, true);
    QK_LAUNCH((cross_entropy_mean_kernel<T>), 1, kMeanThreads, 0, stream(), loss_out, ce_out,
              row_loss, zrow, N, double(n_valid), z_loss);
    QK_CUDA_CHECK_LAUNCH("cross_entropy_mean_kernel");
}

}  // namespace

template <class T>
void cross_entropy_forward(T* loss_out, T* lse, const T* x, const int32_t* t, int64_t N, int64_t V,
                           int32_t ignore_index, int64_t n_valid, int64_t x_ld) {
    if (N == 0) return;
    // Per-row losses in double, as on the cpu: the mean of many rows keeps float32's rows exact.
    // Scratch from the caching allocator (a Storage on cuda): no cudaMalloc per step. Released
    // at return while the kernels may still run: safe, the next user is ordered on the same stream.
    Storage scratch(sizeof(double) * size_t(N), Device::cuda);
    double* row_loss = static_cast<double*>(scratch.data());
    ledger::declare_elements<T>(N * V, N, 4 * N * V);
    QK_LAUNCH((cross_entropy_forward_kernel<T>), unsigned(N), row_threads(V), 0, stream(), lse,
              row_loss, x, t, V, ignore_index, x_ld);
    QK_CUDA_CHECK_LAUNCH("cross_entropy_forward_kernel");
    launch_mean(loss_out, row_loss, N, n_valid);
}

template <class T>
void cross_entropy_backward(T* dx, const T* x, const int32_t* t, const T* lse, const T* dloss,
                            int64_t N, int64_t V, int32_t ignore_index, int64_t n_valid,
                            int64_t x_ld, uint16_t* dx_half, bool half_is_bf16) {
    if (N * V == 0) return;
    ledger::declare(
        double(sizeof(T)) * double(2 * N * V + 2 * N) + (dx_half ? 2.0 * double(N * V) : 0.0),
        4.0 * double(N * V), 0, sizeof(T) == 8);
    QK_LAUNCH((cross_entropy_backward_kernel<T>), blocks_for(N * V, kBackwardThreads),
              kBackwardThreads, 0, stream(), dx, x, t, lse, dloss, N, V, ignore_index,
              T(1.0 / double(n_valid)), x_ld, dx_half, half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
}

template <class T>
void cross_entropy_forward_gradient(T* loss_out, T* lse, uint16_t* g, T* g_upstream, const T* x,
                                    const int32_t* t, int64_t N, int64_t V, int32_t ignore_index,
                                    int64_t n_valid, int64_t x_ld, int64_t g_ld, double assumed,
                                    bool half_is_bf16, double z_loss, T* ce_out) {
    if (N == 0) return;
    // Per-row losses (and lse², with a z-loss) in double, as cross_entropy_forward's.
    Storage scratch(sizeof(double) * size_t(z_loss != 0 ? 2 * N : N), Device::cuda);
    double* row_loss = static_cast<double*>(scratch.data());
    double* zrow = z_loss != 0 ? row_loss + N : nullptr;
    const T scale = T(assumed) * T(1.0 / double(n_valid));  // the backward kernel's dL / n_valid
    const T z_factor = T(assumed) * T(2.0 * z_loss / double(N));  // the fixup's, for `assumed`
    ledger::declare(double(sizeof(T)) * double(N * V + N) + (zrow ? 16.0 : 8.0) * double(N) +
                        2.0 * double(N * g_ld),
                    8.0 * double(N * V));
    QK_LAUNCH((cross_entropy_forward_gradient_kernel<T>), unsigned(N), row_threads(V), 0, stream(),
              lse, row_loss, zrow, g, g_upstream, x, t, V, ignore_index, x_ld, g_ld, T(assumed),
              scale, z_factor, half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("cross_entropy_forward_gradient_kernel");
    launch_mean(loss_out, row_loss, N, n_valid, zrow, z_loss, ce_out);
}

template <class T>
void cross_entropy_gradient_fixup(uint16_t* g, T* g_upstream, const T* x, const int32_t* t,
                                  const T* lse, const T* dloss, int64_t N, int64_t V,
                                  int32_t ignore_index, int64_t n_valid, int64_t x_ld, int64_t g_ld,
                                  bool half_is_bf16, double z_loss) {
    if (N == 0) return;
    // Declared as what it costs when the forward assumed right: one scalar read. A wrong
    // assumption costs a pass over the logits that the ledger does not show.
    ledger::declare(double(sizeof(T)));
    const dim3 grid(1, unsigned(std::min<int64_t>(N, kFixupBlocks)));
    QK_LAUNCH((cross_entropy_gradient_fixup_kernel<T>), grid, row_threads(V), 0, stream(), g,
              g_upstream, tile_counters(1), x, t, lse, dloss, N, V, ignore_index,
              T(1.0 / double(n_valid)), T(2.0 * z_loss / double(N)), x_ld, g_ld, half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("cross_entropy_gradient_fixup_kernel");
}

template void cross_entropy_forward_gradient<float>(float*, float*, uint16_t*, float*, const float*,
                                                    const int32_t*, int64_t, int64_t, int32_t,
                                                    int64_t, int64_t, int64_t, double, bool, double,
                                                    float*);
template void cross_entropy_gradient_fixup<float>(uint16_t*, float*, const float*, const int32_t*,
                                                  const float*, const float*, int64_t, int64_t,
                                                  int32_t, int64_t, int64_t, int64_t, bool, double);
template void cross_entropy_forward<float>(float*, float*, const float*, const int32_t*, int64_t,
                                           int64_t, int32_t, int64_t, int64_t);
template void cross_entropy_forward<double>(double*, double*, const double*, const int32_t*,
                                            int64_t, int64_t, int32_t, int64_t, int64_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, const float*,
                                            const float*, int64_t, int64_t, int32_t, int64_t,
                                            int64_t, uint16_t*, bool);
template void cross_entropy_backward<double>(double*, const double*, const int32_t*, const double*,
                                             const double*, int64_t, int64_t, int32_t, int64_t,
                                             int64_t, uint16_t*, bool);

}  // namespace qk::cuda
