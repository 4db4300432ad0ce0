// Matrix multiplication through OpenBLAS GEMM, batched with numpy broadcasting.
//
// Forward, for every batch index β (a and b are read at the batch index that broadcasts to β):
//     y[β, i, j] = Σ_k a[β, i, k] · b[β, k, j]        a: (..., M, K), b: (..., K, N), y: (..., M,
//     N)
// Saved: b when a requires grad (dA needs it), a when b requires grad (dB needs it); nothing else.
//
// Backward, with dY = ∂L/∂y:
//     ∂L/∂a[β, i, k] = Σ_j dY[β, i, j] · b[β, k, j]   =>   dA = dY · bᵀ    (..., M, N)·(..., N, K)
//     ∂L/∂b[β, k, j] = Σ_i a[β, i, k] · dY[β, i, j]   =>   dB = aᵀ · dY    (..., K, M)·(..., M, N)
// and, as for every broadcasting op, each is then summed over the batch dims its input was
// broadcast along (an input matrix shared by several batches fed all of them):
//     dA = sum_to(dY · bᵀ, a.shape)        dB = sum_to(aᵀ · dY, b.shape)
// Both products are matmuls on transposed views, so the backward is this same forward with the
// transpose flags flipped: nothing is copied.
//
// Memory layout. GEMM reads a (rows, cols) matrix with strides (ld, 1) as row-major ("N") and one
// with strides (1, ld), i.e. a transposed view, as the transpose of a row-major matrix ("T"), with
// leading dimension ld either way. Only a matrix that is neither (e.g. expanded along its rows) is
// copied, once, with contiguous(). Batch dims are walked with per-batch pointer offsets (stride 0
// where broadcast), so an expanded batch dim is never materialised.
//
// The Linear case, x: (B, T, C) times a 2-D weight, is one (B·T, C) GEMM rather than B small ones
// whenever x's batch and row dims merge into one strided dim; its dB = xᵀ · dY is likewise one
// GEMM with inner dim B·T instead of B GEMMs and a sum.
//
// Kernel ladder: v1, the naive triple loop that mirrors the sum above, is the reference in
// tests/test_matmul.cpp; v2 is OpenBLAS, faster because it blocks for the caches and registers
// (packed panels, an AVX-512 micro-kernel) so each loaded element is reused many times.
// OpenBLAS threads itself (qk::set_num_threads), so no OpenMP around the GEMM calls.
#include "ops/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <type_traits>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/strided.h"
#include "ops/reduce.h"

namespace qk {

namespace cpu {

// How GEMM reads one operand: as stored (N) or transposed (T), and its leading dimension.
struct GemmLayout {
    bool trans = false;
    int64_t ld = 1;
};

// y: (M, N) row-major with leading dim ldy; op(a): (M, K); op(b): (K, N).    y = op(a) · op(b)
template <class T>
void gemm(T* y, int64_t ldy, const T* a, GemmLayout la, const T* b, GemmLayout lb, int64_t M,
          int64_t N, int64_t K) {
    const auto ta = la.trans ? CblasTrans : CblasNoTrans, tb = lb.trans ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, a, la.ld, b, lb.ld, 0.0f, y, ldy);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, a, la.ld, b, lb.ld, 0.0, y, ldy);
}

// y: (batch..., M, N) contiguous; a, b: one matrix per batch index at the given batch strides
// (0 where broadcast). One GEMM per batch index, each on pointer offsets: nothing is copied.
template <class T>
void batched_gemm(T* y, const T* a, const Shape& a_batch_strides, GemmLayout la, const T* b,
                  const Shape& b_batch_strides, GemmLayout lb, const Shape& batch, int64_t M,
                  int64_t N, int64_t K) {
    Shape y_batch_strides = contiguous_strides(batch);
    for (int64_t& s : y_batch_strides) s *= M * N;
    // for_each_run walks the batch as runs along its last dim; an empty batch is one run of 1.
    const int64_t sy = batch.empty() ? 0 : y_batch_strides.back();
    const int64_t sa = batch.empty() ? 0 : a_batch_strides.back();
    const int64_t sb = batch.empty() ? 0 : b_batch_strides.back();
    for_each_run<3>(batch, {&y_batch_strides, &a_batch_strides, &b_batch_strides},
                    [&](const auto& off, int64_t n) {
                        for (int64_t i = 0; i < n; ++i)
                            gemm(y + off[0] + i * sy, N, a + off[1] + i * sa, la,
                                 b + off[2] + i * sb, lb, M, N, K);
                    });
}

}  // namespace cpu

namespace detail {
namespace {
std::atomic<int64_t> operand_copies{0};
}
int64_t matmul_operand_copies() { return operand_copies.load(); }
}  // namespace detail

namespace {

Shape batch_of(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// How GEMM can read a (rows, cols) matrix with strides (s_row, s_col), if it can. The stride of a
// size-1 dim is never followed, so it may be anything; ld must still be >= the stored row length.
std::optional<cpu::GemmLayout> gemm_layout(int64_t rows, int64_t cols, int64_t s_row,
                                           int64_t s_col) {
    if ((cols == 1 || s_col == 1) && (rows == 1 || s_row >= cols))  // row-major: (ld, 1)
        return cpu::GemmLayout{false, rows == 1 ? cols : s_row};
    if ((rows == 1 || s_row == 1) && (cols == 1 || s_col >= rows))  // transposed view: (1, ld)
        return cpu::GemmLayout{true, cols == 1 ? rows : s_col};
    return std::nullopt;
}

// t itself when GEMM can read its last two dims, else a contiguous copy (t is detached here:
// the backward works from the original views). Returns the layout either way.
std::pair<Tensor, cpu::GemmLayout> gemm_operand(const Tensor& t) {
    const int64_t r = t.dim() - 2, c = t.dim() - 1;
    auto layout = gemm_layout(t.size(r), t.size(c), t.strides()[r], t.strides()[c]);
    if (layout && layout->ld <= INT_MAX) return {t, *layout};
    ++detail::operand_copies;
    Tensor copy = t.contiguous();
    return {copy, cpu::GemmLayout{false, t.size(c)}};
}

// Strides that read t's batch dims as if expanded to `batch` (0 where t is broadcast).
Shape batch_strides(const Tensor& t, const Shape& batch) {
    Shape strides(batch.size(), 0);
    const size_t lead = batch.size() - (t.dim() - 2);
    for (size_t i = lead; i < batch.size(); ++i)
        if (t.size(i - lead) != 1) strides[i] = t.strides()[i - lead];
    return strides;
}

// True when t's batch dims and its row dim merge into one dim of stride ld, so that t, a
// row-major (..., M, K), reads as one (batch·M, K) matrix with leading dimension ld.
bool rows_merge(const Tensor& t, int64_t ld) {
    int64_t expected = ld;
    for (int64_t d = t.dim() - 2; d >= 0; --d) {
        if (t.size(d) == 1) continue;
        if (t.strides()[d] != expected) return false;
        expected *= t.size(d);
    }
    return true;
}

// t: (..., cols) as a 2-D (rows, cols) matrix: a view when rows_merge allows, else a copy.
Tensor as_rows(const Tensor& t) {
    const int64_t cols = t.size(-1), rows = t.numel() / std::max<int64_t>(cols, 1);
    auto layout = gemm_layout(t.size(-2), cols, t.strides()[t.dim() - 2], t.strides().back());
    if (layout && !layout->trans && rows_merge(t, layout->ld))
        return make_view(t, {rows, cols}, {layout->ld, 1}, t.offset());
    return t.reshape({rows, cols});
}

void check_args(const Tensor& a, const Tensor& b) {
    QK_CHECK(a.defined() && b.defined(), "matmul: got an undefined tensor");
    QK_CHECK(a.dim() >= 2 && b.dim() >= 2,
             "matmul: needs inputs of rank >= 2, got a {} (rank {}) and b {} (rank {})", a.shape(),
             a.dim(), b.shape(), b.dim());
    QK_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()),
             "matmul: needs float32 or float64 inputs, got a {} {} and b {} {}", a.dtype(),
             a.shape(), b.dtype(), b.shape());
    QK_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ: a is {} {}, b is {} {}", a.dtype(),
             a.shape(), b.dtype(), b.shape());
    QK_CHECK(a.device() == b.device(), "matmul: devices differ: a is on {}, b is on {}", a.device(),
             b.device());
    QK_CHECK(
        a.size(-1) == b.size(-2),
        "matmul: inner dimensions differ: a is {}, b is {} (expected a.shape[-1] == b.shape[-2])",
        a.shape(), b.shape());
    for (int64_t i = 1; i <= std::min(a.dim(), b.dim()) - 2; ++i) {
        const int64_t sa = a.size(-2 - i), sb = b.size(-2 - i);
        QK_CHECK(sa == sb || sa == 1 || sb == 1,
                 "matmul: batch dims do not broadcast: a is {}, b is {} (sizes {} and {} at batch "
                 "dim -{})",
                 a.shape(), b.shape(), sa, sb, i);
    }
    for (int64_t n : {a.size(-2), a.size(-1), b.size(-1)})
        QK_CHECK(n <= INT_MAX, "matmul: a {} times b {} has a dim above BLAS's int range",
                 a.shape(), b.shape());
}

// The forward without autograd: y = a · b into a fresh contiguous tensor.
Tensor matmul_forward(const Tensor& a_in, const Tensor& b_in) {
    const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
    const Shape batch = broadcast_shapes(batch_of(a_in), batch_of(b_in), "matmul");
    Shape out_shape = batch;
    out_shape.insert(out_shape.end(), {M, N});
    if (numel_of(out_shape) == 0) return Tensor::empty(out_shape, a_in.dtype(), a_in.device());
    if (K == 0) return zeros(out_shape, a_in.dtype(), a_in.device());  // an empty sum
    Tensor y = Tensor::empty(out_shape, a_in.dtype(), a_in.device());

    auto [a, la] = gemm_operand(a_in);
    auto [b, lb] = gemm_operand(b_in);
    // The Linear case: one matrix b shared by every batch, a's rows stacked at one stride.
    const bool one_gemm = numel_of(batch_of(b)) == 1 && !la.trans && rows_merge(a, la.ld) &&
                          numel_of(batch) * M <= INT_MAX;
    switch (y.device()) {
        case Device::cpu:
            dispatch_float(y.dtype(), [&](auto tag) {
                using T = decltype(tag);
                if (one_gemm)
                    cpu::gemm(y.data<T>(), N, a.data<T>(), la, b.data<T>(), lb, numel_of(batch) * M,
                              N, K);
                else
                    cpu::batched_gemm(y.data<T>(), a.data<T>(), batch_strides(a, batch), la,
                                      b.data<T>(), batch_strides(b, batch), lb, batch, M, N, K);
            });
            break;
        case Device::cuda:
            QK_CHECK(false, "matmul: no CUDA kernel yet");
    }
    return y;
}

// dB = sum_to(aᵀ · dY, b.shape). When b is one matrix shared by every batch (the Linear case),
// the batch sum folds into the GEMM's inner dim: dB = a_rowsᵀ · dY_rows, (K, B·M)·(B·M, N).
Tensor grad_b(const Tensor& a, const Tensor& dy, const Shape& b_shape) {
    const bool shared_b = numel_of(Shape(b_shape.begin(), b_shape.end() - 2)) == 1;
    if (shared_b && dy.dim() > 2) return matmul(as_rows(a).t(), as_rows(dy)).view(b_shape);
    return sum_to(matmul(a.transpose(-2, -1), dy), b_shape);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
    check_args(a, b);
    Tensor y = matmul_forward(a.detach(), b.detach());
    // Save only what the backward reads: b for dA, a for dB (and only for inputs wanting grad).
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Tensor a_saved = need_b ? a.detach() : Tensor(), b_saved = need_a ? b.detach() : Tensor();
    auto backward = [need_a, need_b, a_saved, b_saved, a_shape = a.shape(),
                     b_shape = b.shape()](const Tensor& dy) {
        Tensor da, db;
        if (need_a) da = sum_to(matmul(dy, b_saved.transpose(-2, -1)), a_shape);  // dY · bᵀ
        if (need_b) db = grad_b(a_saved, dy, b_shape);                            // aᵀ · dY
        return std::vector<Tensor>{da, db};
    };
    return autograd::record("matmul", y, {a, b}, std::move(backward));
}

}  // namespace qk
