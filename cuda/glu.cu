// cuda/glu.cu — the gated product of a GLU MLP on the device, forward and backward in one launch
// each (ops/glu.cpp has the math). Work split as cuda/elementwise.cu: four elements per thread in
// flight, 256 threads per block, a grid-stride loop; the activations are the functors of
// ops/elementwise_math.h, the cpu's.
//
// CPU twins: cpu::glu_forward and cpu::glu_backward in ops/glu.cpp.
#include <cstdint>

#include "cuda/runtime.h"
#include "cuda/strided_index.h"
#include "ops/elementwise_math.h"
#include "ops/glu.h"

namespace qk::cuda {

namespace {

// y, gate, up: (n) contiguous.    y = act(g) · u
template <class T, class Act>
__global__ void glu_forward_kernel(T* y, const T* gate, const T* up, int64_t n) {
    struct Pair {
        T g, u;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            return Pair{gate[i], up[i]};
        },
        [&](int64_t i, Pair p) { y[i] = Act{}(p.g, T(0)) * p.u; });
}

// dgate, dup, dy, gate, up: (n) contiguous.    du = dy · a,   dg = act'(g) · (dy · u)
template <class T, class Act, class ActBackward>
__global__ void glu_backward_kernel(T* dgate, T* dup, const T* dy, const T* gate, const T* up,
                                    int64_t n) {
    struct Triple {
        T dy, g, u;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            return Triple{dy[i], gate[i], up[i]};
        },
        [&](int64_t i, Triple t) {
            dup[i] = t.dy * Act{}(t.g, T(0));
            dgate[i] = ActBackward{}(t.dy * t.u, t.g, T(0));
        });
}

}  // namespace

template <class T>
void glu_forward(T* y, const T* gate, const T* up, int64_t n, GluActivation activation) {
    if (n == 0) return;
    ledger::declare_elements<T>(2 * n, n, 8 * n);
    if (activation == GluActivation::silu)
        QK_LAUNCH((glu_forward_kernel<T, math::Silu>), grid_for_unrolled(n), kThreads, 0, stream(),
                  y, gate, up, n);
    else
        QK_LAUNCH((glu_forward_kernel<T, math::Gelu>), grid_for_unrolled(n), kThreads, 0, stream(),
                  y, gate, up, n);
    QK_CUDA_CHECK_LAUNCH("glu_forward_kernel");
}

template <class T>
void glu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n,
                  GluActivation activation) {
    if (n == 0) return;
    ledger::declare_elements<T>(3 * n, 2 * n, 20 * n);
    if (activation == GluActivation::silu)
        QK_LAUNCH((glu_backward_kernel<T, math::Silu, math::SiluBackward>), grid_for_unrolled(n),
                  kThreads, 0, stream(), dgate, dup, dy, gate, up, n);
    else
        QK_LAUNCH((glu_backward_kernel<T, math::Gelu, math::GeluBackward>), grid_for_unrolled(n),
                  kThreads, 0, stream(), dgate, dup, dy, gate, up, n);
    QK_CUDA_CHECK_LAUNCH("glu_backward_kernel");
}

template void glu_forward<float>(float*, const float*, const float*, int64_t, GluActivation);
template void glu_forward<double>(double*, const double*, const double*, int64_t, GluActivation);
template void glu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t,
                                  GluActivation);
template void glu_backward<double>(double*, double*, const double*, const double*, const double*,
                                   int64_t, GluActivation);

}  // namespace qk::cuda
