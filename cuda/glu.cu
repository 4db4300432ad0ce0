// cuda/glu.cu — the gated product of a GLU MLP on the device, forward and backward in one launch
// each (ops/glu.cpp has the math). Work split as cuda/elementwise.cu: four elements per thread in
// flight, 256 threads per block, a grid-stride loop; the activations are the functors of
// ops/elementwise_math.h, the cpu's.
//
// CPU twins: cpu::glu_forward and cpu::glu_backward in ops/glu.cpp.
#include <cstdint>

#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/strided_index.h"
#include "ops/elementwise_math.h"
#include "ops/glu.h"

namespace qk::cuda {

namespace {

// y, gate, up: (n) contiguous.    y = act(g) · u
// y_half: null or (n), y rounded (bf16 or fp16 bits).
template <class T, class Act>
__global__ void glu_forward_kernel(T* y, const T* gate, const T* up, int64_t n, uint16_t* y_half,
                                   bool half_is_bf16) {
    struct Pair {
        T g, u;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            return Pair{gate[i], up[i]};
        },
        [&](int64_t i, Pair p) {
            const T value = Act{}(p.g, T(0)) * p.u;
            if (y) y[i] = value;
            store_half(y_half, i, value, half_is_bf16);
        });
}

// dgate, dup, dy, gate, up: (n) contiguous.    du = dy · a,   dg = act'(g) · (dy · u)
// dgate_half, dup_half: null or (n), the gradients rounded; dgate, dup may be null where their
// rounding is written (the gated MLP's node, ops/matmul.h's glu_linear).
template <class T, class Act, class ActBackward>
__global__ void glu_backward_kernel(T* dgate, T* dup, const T* dy, const T* gate, const T* up,
                                    int64_t n, uint16_t* dgate_half, uint16_t* dup_half,
                                    bool half_is_bf16) {
    struct Triple {
        T dy, g, u;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            return Triple{dy[i], gate[i], up[i]};
        },
        [&](int64_t i, Triple t) {
            const T du = t.dy * Act{}(t.g, T(0));
            const T dg = ActBackward{}(t.dy * t.u, t.g, T(0));
            if (dup) dup[i] = du;
            if (dgate) dgate[i] = dg;
            store_half(dup_half, i, du, half_is_bf16);
            store_half(dgate_half, i, dg, half_is_bf16);
        });
}

}  // namespace

template <class T>
void glu_forward(T* y, const T* gate, const T* up, int64_t n, GluActivation activation,
                 uint16_t* y_half, bool half_is_bf16) {
    if (n == 0) return;
    QK_CHECK(y || y_half, "glu_forward: neither y nor its rounding to write ({} elements)", n);
    ledger::declare(
        double(sizeof(T)) * double(y ? 3 * n : 2 * n) + (y_half ? 2.0 * double(n) : 0.0),
        8.0 * double(n), 0, sizeof(T) == 8);
    if (activation == GluActivation::silu)
        QK_LAUNCH((glu_forward_kernel<T, math::Silu>), grid_for_unrolled(n), kThreads, 0, stream(),
                  y, gate, up, n, y_half, half_is_bf16);
    else
        QK_LAUNCH((glu_forward_kernel<T, math::Gelu>), grid_for_unrolled(n), kThreads, 0, stream(),
                  y, gate, up, n, y_half, half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("glu_forward_kernel");
}

template <class T>
void glu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n,
                  GluActivation activation, uint16_t* dgate_half, uint16_t* dup_half,
                  bool half_is_bf16) {
    if (n == 0) return;
    QK_CHECK((dgate || dgate_half) && (dup || dup_half),
             "glu_backward: each gradient needs a float or a rounded output ({} elements)", n);
    const int64_t written = (dgate ? n : 0) + (dup ? n : 0);
    ledger::declare(double(sizeof(T)) * double(3 * n + written) +
                        (dgate_half ? 2.0 * double(n) : 0.0) + (dup_half ? 2.0 * double(n) : 0.0),
                    20.0 * double(n), 0, sizeof(T) == 8);
    if (activation == GluActivation::silu)
        QK_LAUNCH((glu_backward_kernel<T, math::Silu, math::SiluBackward>), grid_for_unrolled(n),
                  kThreads, 0, stream(), dgate, dup, dy, gate, up, n, dgate_half, dup_half,
                  half_is_bf16);
    else
        QK_LAUNCH((glu_backward_kernel<T, math::Gelu, math::GeluBackward>), grid_for_unrolled(n),
                  kThreads, 0, stream(), dgate, dup, dy, gate, up, n, dgate_half, dup_half,
                  half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("glu_backward_kernel");
}

template void glu_forward<float>(float*, const float*, const float*, int64_t, GluActivation,
                                 uint16_t*, bool);
template void glu_forward<double>(double*, const double*, const double*, int64_t, GluActivation,
                                  uint16_t*, bool);
template void glu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t,
                                  GluActivation, uint16_t*, uint16_t*, bool);
template void glu_backward<double>(double*, double*, const double*, const double*, const double*,
                                   int64_t, GluActivation, uint16_t*, uint16_t*, bool);

}  // namespace qk::cuda
