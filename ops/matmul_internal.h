// What ops/matmul.cpp, ops/matmul_layout.cpp and ops/matmul_bf16.cpp share. Internal: not part of
// the public headers that qk.h gathers.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "core/tensor.h"
#include "ops/gemm.h"

namespace qk::matmul_impl {

// ---- ops/matmul_layout.cpp: how GEMM reads a tensor's memory --------------------------------

// t's batch dims: its shape without the last two.
Shape batch_of(const Tensor& t);

// How GEMM can read a (rows, cols) matrix with strides (s_row, s_col), if it can. The stride of a
// size-1 dim is never followed, so it may be anything; ld must still be >= the stored row length.
std::optional<cpu::GemmLayout> gemm_layout(int64_t rows, int64_t cols, int64_t s_row,
                                           int64_t s_col);

// t itself when GEMM can read its last two dims, else a contiguous copy (counted by
// detail::matmul_operand_copies). t is detached: the backward works from the original views.
// Returns the layout either way.
std::pair<Tensor, cpu::GemmLayout> gemm_operand(const Tensor& t);

// Strides that read t's batch dims as if expanded to `batch` (0 where t is broadcast).
Shape batch_strides(const Tensor& t, const Shape& batch);

// True when t's batch dims and its row dim merge into one dim of stride ld, so that t, a
// row-major (..., M, K), reads as one (batch·M, K) matrix with leading dimension ld.
bool rows_merge(const Tensor& t, int64_t ld);

// t: (..., cols) as a 2-D (rows, cols) matrix: a view when rows_merge allows, else a copy.
Tensor as_rows(const Tensor& t);

// t: (..., K) as a 2-D (rows, K) matrix; a 1-D t is one row.
Tensor rows_of(const Tensor& t);

// ---- ops/matmul_bf16.cpp ----------------------------------------------------------------------

// linear(x, weight, bias, Precision::bf16), its arguments already checked by linear.
Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear(x, weight, bias, Precision::fp16): the same on float16 operands.
Tensor linear_fp16(const Tensor& x, const Tensor& weight, const Tensor& bias);

}  // namespace qk::matmul_impl
