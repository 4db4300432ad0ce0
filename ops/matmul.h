// Matrix multiplication through OpenBLAS.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace qk {

// a: (..., M, K), b: (..., K, N) -> (..., M, N). float32 or float64, both the same.
// The batch dims broadcast like numpy (a missing or size-1 batch dim is read with stride 0, never
// copied); 2-D inputs are plain GEMMs, and a batched a times a 2-D b (a Linear layer) is one GEMM
// over all of a's rows. Transposed views, e.g. matmul(x, w.t()), are handed to GEMM as transpose
// flags, not copied; only an operand GEMM cannot address (no unit stride in its last two dims) is
// made contiguous first. Differentiable in both inputs.
Tensor matmul(const Tensor& a, const Tensor& b);

// A Linear layer as one op: x: (..., in), weight: (out, in), bias: (out) or undefined ->
// (..., out) = x · weightᵀ + bias. Same result as matmul(x, weight.t()) + bias, with the bias
// added inside the GEMM (see ops/matmul.cpp). Differentiable in all three.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

namespace detail {
// How many operands matmul has copied because GEMM could not read them as stored (for tests).
int64_t matmul_operand_copies();
}  // namespace detail

}  // namespace qk
