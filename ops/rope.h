// Rotary position embeddings (RoPE, Su et al. 2021), the rotate-half convention of GPT-NeoX and
// Llama: each head vector's pairs (x_i, x_{i+D/2}) are turned by the angle t·θ^(−2i/D) of their
// position t, so that a dot product of two rotated vectors depends only on their distance.
#pragma once

#include "core/tensor.h"

namespace qk {

// cos and sin of the angles, (T, D/2) each: [t, i] = cos / sin(t · θ^(−2i/D)) for positions
// t = 0 … T−1. The angles are computed in float64 and rounded once to `dtype`.
struct RopeTables {
    Tensor cos, sin;
};
RopeTables rope_tables(int64_t T, int64_t D, double theta, DType dtype = kF32,
                       Device device = Device::cpu);

// x: (..., T, D), D even; cos, sin: (T, D/2), x's dtype and device (rope_tables, or a narrowed
// slice of longer tables for positions that start elsewhere). Returns (..., T, D), contiguous:
//   y_i = x_i·cos − x_{i+D/2}·sin,   y_{i+D/2} = x_{i+D/2}·cos + x_i·sin   (i < D/2)
// Differentiable in x; the tables are constants (a table that requires grad is refused).
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin);

// The pieces of rope() that layer_norm and rms_norm reuse when they rotate their output
// (ops/norm.h): the checks on x and the tables (messages name `op`), and the rotation itself
// without autograd, by the angle (direction +1) or its negative (−1): x (..., P, D) contiguous,
// tables (P, D/2) contiguous.
void check_rope_tables(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin);
Tensor rope_rotated(const Tensor& x, const Tensor& cos, const Tensor& sin, int direction);

namespace cpu {
// y, x: (G, P, D) contiguous, G = the product of x's leading dims, P positions; cos, sin:
// (P, D/2).
// direction +1 rotates by the angle (forward), −1 by its negative (the backward: a rotation's
// transpose is its inverse).
template <class T>
void rope_rotate_v1(T* y, const T* x, const T* cos, const T* sin, int64_t G, int64_t P, int64_t D,
                    int direction);
template <class T>
void rope_rotate(T* y, const T* x, const T* cos, const T* sin, int64_t G, int64_t P, int64_t D,
                 int direction);
}  // namespace cpu

// The CUDA twin (cuda/rope.cu): device pointers, same layout and meaning. float and double.
namespace cuda {
template <class T>
void rope_rotate(T* y, const T* x, const T* cos, const T* sin, int64_t G, int64_t P, int64_t D,
                 int direction);
}  // namespace cuda

}  // namespace qk
