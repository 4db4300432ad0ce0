// CUDA AdamW: the fused per-element update of one parameter tensor.
// Twin of nn/optim/optim.cpp (cpu::adamw_update), whose header gives the math:
//   m = β1 m + (1 − β1) g,  v = β2 v + (1 − β2) g²,  m̂ = m / bias1,  v̂ = v / bias2,
//   p = p − lr · (m̂ / (sqrt(v̂) + ε) + decay · p)
// with bias1 = 1 − β1^t and bias2 = 1 − β2^t computed once per step on the host.
//
// Work split: one thread per element, kThreads = 256 per block, grid = ceil(n / 256) blocks. Each
// thread reads p, g, m, v once and writes p, m, v once: a memory-bound pass, coalesced, with no
// communication between threads (so no barriers and the same bits under every run order).
//
// Same arithmetic as the cpu loop, term for term. The results may still differ in the last bits
// from the cpu's: nvcc contracts a * b + c into fma (one rounding instead of two) where g++ at
// -O2 on x86-64 does not by default, and the cpu loop is vectorised with its own contraction
// rules. Parity is therefore within f32 tolerance over several steps, not bitwise.
#include <cstdint>

#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "nn/optim/optim.h"

namespace qk::cuda {

namespace {

constexpr int kThreads = 256;

// p, m, v: (n) updated in place; g: (n).
template <class T>
__global__ void adamw_update_kernel(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2,
                                    T eps, T decay, T bias1, T bias2) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const T gi = g[i];
    const T mi = beta1 * m[i] + (1 - beta1) * gi;       // first moment
    const T vi = beta2 * v[i] + (1 - beta2) * gi * gi;  // second moment
    m[i] = mi;
    v[i] = vi;
    const T m_hat = mi / bias1, v_hat = vi / bias2;  // bias corrections
    const T pi = p[i];
    p[i] = pi - lr * (m_hat / (dev_sqrt(v_hat) + eps) + decay * pi);  // decoupled decay
}

}  // namespace

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps, T decay,
                  T bias1, T bias2) {
    if (n == 0) return;
    ledger::declare_elements<T>(4 * n, 3 * n, 12 * n);
    QK_LAUNCH((adamw_update_kernel<T>), blocks_for(n, kThreads), kThreads, 0, stream(), p, g, m, v,
              n, lr, beta1, beta2, eps, decay, bias1, bias2);
    QK_CUDA_CHECK_LAUNCH("adamw_update_kernel");
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float,
                                  float, float, float, float, float);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, double,
                                   double, double, double, double, double, double);

}  // namespace qk::cuda
