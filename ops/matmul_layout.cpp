// How matmul and linear hand a tensor to GEMM without copying it: GEMM reads a (rows, cols)
// matrix with strides (ld, 1) as stored ("N") and one with strides (1, ld), a transposed view, as
// the transpose of a row-major matrix ("T"); batch dims are walked with per-batch offsets (stride
// 0 where broadcast); and a (..., M, K) tensor whose batch and row dims merge into one strided dim
// reads as one (batch·M, K) matrix. Only an operand that fits none of these is copied. The math
// of the ops is in ops/matmul.cpp.
#include <atomic>
#include <climits>

#include "core/strided.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"

namespace qk {

namespace detail {
namespace {
std::atomic<int64_t> operand_copies{0};
}
int64_t matmul_operand_copies() { return operand_copies.load(); }
}  // namespace detail

namespace matmul_impl {

Shape batch_of(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

std::optional<cpu::GemmLayout> gemm_layout(int64_t rows, int64_t cols, int64_t s_row,
                                           int64_t s_col) {
    if ((cols == 1 || s_col == 1) && (rows == 1 || s_row >= cols))  // row-major: (ld, 1)
        return cpu::GemmLayout{false, rows == 1 ? cols : s_row};
    if ((rows == 1 || s_row == 1) && (cols == 1 || s_col >= rows))  // transposed view: (1, ld)
        return cpu::GemmLayout{true, cols == 1 ? rows : s_col};
    return std::nullopt;
}

std::pair<Tensor, cpu::GemmLayout> gemm_operand(const Tensor& t) {
    const int64_t r = t.dim() - 2, c = t.dim() - 1;
    auto layout = gemm_layout(t.size(r), t.size(c), t.strides()[r], t.strides()[c]);
    if (layout && layout->ld <= INT_MAX) return {t, *layout};
    ++detail::operand_copies;
    Tensor copy = t.contiguous();
    return {copy, cpu::GemmLayout{false, t.size(c)}};
}

Shape batch_strides(const Tensor& t, const Shape& batch) {
    Shape strides(batch.size(), 0);
    const size_t lead = batch.size() - (t.dim() - 2);
    for (size_t i = lead; i < batch.size(); ++i)
        if (t.size(i - lead) != 1) strides[i] = t.strides()[i - lead];
    return strides;
}

bool rows_merge(const Tensor& t, int64_t ld) {
    int64_t expected = ld;
    for (int64_t d = t.dim() - 2; d >= 0; --d) {
        if (t.size(d) == 1) continue;
        if (t.strides()[d] != expected) return false;
        expected *= t.size(d);
    }
    return true;
}

Tensor as_rows(const Tensor& t) {
    const int64_t cols = t.size(-1), rows = t.numel() / std::max<int64_t>(cols, 1);
    auto layout = gemm_layout(t.size(-2), cols, t.strides()[t.dim() - 2], t.strides().back());
    if (layout && !layout->trans && rows_merge(t, layout->ld))
        return make_view(t, {rows, cols}, {layout->ld, 1}, t.offset());
    return t.reshape({rows, cols});
}

Tensor rows_of(const Tensor& t) {
    const int64_t K = t.size(-1);
    if (t.dim() >= 2 && K > 0) return as_rows(t);
    return t.reshape({numel_of(Shape(t.shape().begin(), t.shape().end() - 1)), K});
}

bool stored_transposed(const Tensor& t) {
    const int64_t r = t.dim() - 2, c = t.dim() - 1;
    if (t.size(r) == 1 || t.size(c) == 1) return false;
    auto layout = gemm_layout(t.size(r), t.size(c), t.strides()[r], t.strides()[c]);
    return layout && layout->trans;
}

}  // namespace matmul_impl

}  // namespace qk
