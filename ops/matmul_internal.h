// What ops/matmul.cpp, ops/matmul_layout.cpp and ops/matmul_bf16.cpp share. Internal: not part of
// the public headers that qk.h gathers.
#pragma once

#include <climits>
#include <cstdint>
#include <optional>
#include <utility>

#include "core/strided.h"
#include "core/tensor.h"
#include "ops/gemm.h"
#include "ops/glu.h"
#include "ops/loss.h"

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

// True when GEMM reads t's last two dims as a transposed row-major matrix, strides (1, ld): W.t()
// in a Linear layer, kᵀ in attention.
bool stored_transposed(const Tensor& t);

// One strided-batched device GEMM's share of a batch: `count` matrices, the first at these element
// offsets into y, a and b, the next ones each stride further on (0 for a broadcast operand).
struct BatchRun {
    int64_t y, a, b;
    int64_t stride_y, stride_a, stride_b;
    int64_t count;
};

// A batched product's batch (y contiguous, y_matrix = M·N elements a matrix) walked as runs along
// its innermost dim, one run(BatchRun) each, outer dims looping on the host. Batch dims that every
// operand steps through evenly merge first, so attention's (B, H) is one call of B·H matrices, not
// B calls of H: cuBLAS fills the GPU only with enough matrices (a 1024 × 1024 × 64 product is 8
// tiles; 12 of them left most of an H200's 132 SMs idle).
template <class Run>
void for_each_batch_run(const Shape& batch, int64_t y_matrix, const Shape& a_batch_strides,
                        const Shape& b_batch_strides, Run run) {
    Shape y_batch_strides = contiguous_strides(batch);
    for (int64_t& s : y_batch_strides) s *= y_matrix;
    Shape dims, ys, as, bs;  // the batch with mergeable neighbours merged
    for (size_t d = 0; d < batch.size(); ++d) {
        const bool merges = !dims.empty() && ys.back() == y_batch_strides[d] * batch[d] &&
                            as.back() == a_batch_strides[d] * batch[d] &&
                            bs.back() == b_batch_strides[d] * batch[d] &&
                            dims.back() * batch[d] <= INT_MAX;
        if (merges) {
            dims.back() *= batch[d];
            ys.back() = y_batch_strides[d], as.back() = a_batch_strides[d],
            bs.back() = b_batch_strides[d];
        } else {
            dims.push_back(batch[d]);
            ys.push_back(y_batch_strides[d]), as.push_back(a_batch_strides[d]),
                bs.push_back(b_batch_strides[d]);
        }
    }
    const int64_t sy = dims.empty() ? 0 : ys.back();
    const int64_t sa = dims.empty() ? 0 : as.back();
    const int64_t sb = dims.empty() ? 0 : bs.back();
    for_each_run<3>(dims, {&ys, &as, &bs}, [&](const auto& off, int64_t n) {
        run(BatchRun{off[0], off[1], off[2], sy, sa, sb, n});
    });
}

// ---- ops/matmul.cpp ---------------------------------------------------------------------------

// linear's argument checks (shapes, dtypes, devices), for the ops that run a linear inside.
void check_linear_args(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       Precision precision);

// ---- ops/matmul_batched_bf16.cpp --------------------------------------------------------------

// matmul(a, b, Precision::bf16, alpha) and the fp16 twin, their arguments checked by matmul.
Tensor matmul_bf16(const Tensor& a, const Tensor& b, float alpha);
Tensor matmul_fp16(const Tensor& a, const Tensor& b, float alpha);

// ---- ops/matmul_bf16.cpp ----------------------------------------------------------------------

// linear(x, weight, bias, Precision::bf16), its arguments already checked by linear.
Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear(x, weight, bias, Precision::fp16): the same on float16 operands.
Tensor linear_fp16(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear_gelu at bf16 and fp16 precision, its arguments already checked.
Tensor linear_gelu_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        Precision rounded_copy);
Tensor linear_gelu_fp16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        Precision rounded_copy);
// Whether linear(x, weight, bias) at bf16 / fp16 runs its GEMMs on a zero-padded width (a cuda
// Linear without bias whose output width is not a multiple of 8, from 1,024 rows): the MLP ops'
// nodes read their first Linear's output as contiguous rows, so those shapes run the ops.
bool linear_pads_width(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear_gelu_linear at bf16 and fp16 precision, its arguments already checked, c_fc not padded.
Tensor linear_gelu_linear_bf16(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                               const Tensor& w_proj, const Tensor& b_proj);
Tensor linear_gelu_linear_fp16(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                               const Tensor& w_proj, const Tensor& b_proj);
// glu_linear at bf16 and fp16 precision on cuda, its arguments already checked, not padded.
Tensor glu_linear_bf16(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                       const Tensor& w_proj, const Tensor& b_proj, GluActivation activation);
Tensor glu_linear_fp16(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                       const Tensor& w_proj, const Tensor& b_proj, GluActivation activation);

// linear_cross_entropy at bf16 and fp16 precision on cuda: x (N, K) and weight (V, K) float32,
// checked; t (N) int32 contiguous, checked by cross_entropy's rules, n_valid of them not ignored.
LinearCrossEntropy linear_cross_entropy_bf16(const Tensor& x, const Tensor& weight, const Tensor& t,
                                             int32_t ignore_index, int64_t n_valid,
                                             double loss_gradient, double z_loss);
LinearCrossEntropy linear_cross_entropy_fp16(const Tensor& x, const Tensor& weight, const Tensor& t,
                                             int32_t ignore_index, int64_t n_valid,
                                             double loss_gradient, double z_loss);

}  // namespace qk::matmul_impl
