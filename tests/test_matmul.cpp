// matmul: forward against a naive triple loop in double (every layout GEMM is handed: transposed,
// narrowed, batched, broadcast), float32 against float64, float64 gradchecks, and bad inputs.
#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;

namespace {

// v1, the reference: y[β, i, j] = Σ_k a[β, i, k] · b[β, k, j] in double, with the batch index β
// mapped to a's and b's own batch index by the numpy rules (missing or size-1 dims read index 0).
// Reads the inputs through to_vector (logical order), so it shares no layout logic with matmul.
Tensor matmul_ref(const Tensor& a, const Tensor& b) {
    const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
    const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
    const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul_ref");
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
    // The linear index of batch element `index` in an operand with batch shape `own`.
    auto own_index = [&](const Shape& own, const Shape& index) {
        int64_t linear = 0;
        const size_t lead = batch.size() - own.size();
        for (size_t d = 0; d < own.size(); ++d)
            linear = linear * own[d] + (own[d] == 1 ? 0 : index[lead + d]);
        return linear;
    };
    std::vector<double> out;
    Shape index(batch.size(), 0);
    for (int64_t n = 0; n < numel_of(batch); ++n) {
        for (int64_t r = n, d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
            index[d] = r % batch[d];
            r /= batch[d];
        }
        const double* pa = va.data() + own_index(a_batch, index) * M * K;
        const double* pb = vb.data() + own_index(b_batch, index) * K * N;
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                double acc = 0;
                for (int64_t k = 0; k < K; ++k) acc += pa[i * K + k] * pb[k * N + j];
                out.push_back(acc);
            }
    }
    Shape out_shape = batch;
    out_shape.insert(out_shape.end(), {M, N});
    return from_vector(out, out_shape, kF64);
}

// matmul(a, b) against the reference, in the inputs' dtype (float32 gets float32's tolerance).
void check_forward(const Tensor& a, const Tensor& b) {
    Tensor y = matmul(a, b), ref = matmul_ref(a, b);
    INFO("a ", a.shape(), " strides ", a.strides(), ", b ", b.shape(), " strides ", b.strides());
    REQUIRE(y.shape() == ref.shape());
    CHECK(max_abs_diff(y, ref) <= (a.dtype() == kF64 ? 1e-12 : 1e-5));
}

Tensor randn_seeded(const Shape& shape, uint64_t seed, DType dtype = kF64) {
    Generator gen(seed);
    return randn(shape, dtype, gen);
}

}  // namespace

TEST_CASE("2-D matmul matches the naive loop, contiguous and transposed views") {
    for (DType dt : {kF64, kF32}) {
        Tensor a = randn_seeded({5, 7}, 1, dt), b = randn_seeded({7, 3}, 2, dt);
        Tensor at = randn_seeded({7, 5}, 3, dt).t(), bt = randn_seeded({3, 7}, 4, dt).t();
        check_forward(a, b);
        check_forward(at, b);   // a read with CblasTrans
        check_forward(a, bt);   // b read with CblasTrans: the Linear x · Wᵀ
        check_forward(at, bt);  // both
    }
}

TEST_CASE("one row of output (a decode step) goes through gemv, every layout and leading dim") {
    for (DType dt : {kF64, kF32}) {
        const Tensor a = randn_seeded({1, 9}, 5, dt), b = randn_seeded({9, 6}, 6, dt);
        const Tensor a_t = randn_seeded({9, 1}, 7, dt).t();                     // a stored (K, 1)
        const Tensor a_wide = randn_seeded({9, 4}, 8, dt).narrow(1, 2, 1).t();  // K apart 4
        const Tensor b_t = randn_seeded({6, 9}, 9, dt).t();                     // the Linear's Wᵀ
        const Tensor b_wide = randn_seeded({9, 10}, 10, dt).narrow(1, 1, 6);    // ld 10
        for (const Tensor& x : {a, a_t, a_wide})
            for (const Tensor& w : {b, b_t, b_wide}) check_forward(x, w);
        // linear's bias comes into the gemv as beta = 1 over y = b.
        const Tensor w = randn_seeded({6, 9}, 11, dt), bias = randn_seeded({6}, 12, dt);
        const Tensor want = matmul_ref(a, w.t()) + bias.to(kF64);
        CHECK(max_abs_diff(linear(a, w, bias), want) <= (dt == kF64 ? 1e-12 : 1e-5));
    }
}

TEST_CASE("narrowed views are read through their leading dimension") {
    Tensor wide = randn_seeded({6, 10}, 5), tall = randn_seeded({12, 4}, 6);
    check_forward(wide.narrow(1, 2, 7), randn_seeded({7, 4}, 7));  // a: strides (10, 1)
    check_forward(randn_seeded({3, 8}, 8), tall.narrow(0, 3, 8));  // b: offset rows
    check_forward(randn_seeded({2, 6}, 9), wide.narrow(1, 1, 8).t().narrow(0, 0, 6));  // T, ld 10
    check_forward(wide.narrow(0, 1, 4).t(), randn_seeded({4, 5}, 10));  // (10, 4) transposed
}

TEST_CASE("batched matmul, with broadcast and missing batch dims") {
    check_forward(randn_seeded({3, 4, 5}, 11), randn_seeded({3, 5, 2}, 12));
    check_forward(randn_seeded({2, 3, 4, 5}, 13), randn_seeded({2, 3, 5, 6}, 14));
    check_forward(randn_seeded({1, 4, 5}, 15), randn_seeded({3, 5, 6}, 16));  // size-1 batch
    check_forward(randn_seeded({2, 1, 4, 5}, 17),
                  randn_seeded({1, 3, 5, 6}, 18));                            // both broadcast
    check_forward(randn_seeded({4, 5}, 19), randn_seeded({2, 3, 5, 6}, 20));  // a 2-D
    check_forward(randn_seeded({2, 3, 4, 5}, 21), randn_seeded({5, 6}, 22));  // b 2-D: one GEMM
    check_forward(randn_seeded({2, 3, 4, 5}, 23),
                  randn_seeded({1, 1, 5, 6}, 24));  // b's batch all 1
    check_forward(randn_seeded({2, 5, 4}, 25).transpose(1, 2),
                  randn_seeded({5, 6}, 26));  // a T, b 2-D
    check_forward(randn_seeded({4, 3, 5}, 27).transpose(0, 1),
                  randn_seeded({5, 6}, 28));  // rows split
    check_forward(randn_seeded({2, 4, 9}, 29).narrow(2, 1, 5),
                  randn_seeded({5, 6}, 30));                                   // ld 9, merges
    check_forward(randn_seeded({3, 4, 5}, 31), randn_seeded({6, 5}, 32).t());  // x · Wᵀ batched
    check_forward(randn_seeded({1, 4, 5}, 33).expand({3, 4, 5}), randn_seeded({3, 5, 2}, 34));
    check_forward(randn_seeded({3, 4, 5}, 35), randn_seeded({2, 1, 5, 2}, 36).expand({2, 3, 5, 2}));
}

TEST_CASE("degenerate sizes: vectors as matrices, empty inner and outer dims") {
    check_forward(randn_seeded({1, 5}, 37), randn_seeded({5, 1}, 38));  // dot product
    check_forward(randn_seeded({4, 1}, 39), randn_seeded({1, 3}, 40));  // outer product
    check_forward(randn_seeded({6, 1}, 41).t(), randn_seeded({6, 3}, 42));
    Tensor y = matmul(zeros({2, 3, 0}), zeros({0, 4}));  // K = 0: a sum of nothing
    CHECK(y.shape() == Shape{2, 3, 4});
    CHECK(y.to_vector<float>() == std::vector<float>(24, 0.0f));
    CHECK(matmul(zeros({0, 3, 2}), zeros({2, 4})).shape() == Shape{0, 3, 4});
    CHECK(matmul(zeros({3, 2}), zeros({2, 0})).shape() == Shape{3, 0});
}

TEST_CASE("transposed and broadcast operands are read in place, not copied") {
    const int64_t before = detail::matmul_operand_copies();
    Tensor x = leaf({2, 3, 4}, 43), w = leaf({5, 4}, 44);
    Tensor y = matmul(x, w.t());              // the Linear layer: sgemm(N, T) on x's (6, 4) rows
    y.backward(randn_seeded({2, 3, 5}, 45));  // dX = dY · W (N, N), dWᵀ = x_rowsᵀ · dY (T, N)
    check_forward(x.detach(), w.detach().t());
    matmul(x.transpose(1, 2), randn_seeded({2, 3, 6}, 46));
    CHECK(detail::matmul_operand_copies() == before);
    // Expanded rows (stride 0) are the layout GEMM cannot read: that one copy is counted.
    check_forward(randn_seeded({1, 4}, 47).expand({3, 4}), randn_seeded({4, 2}, 48));
    CHECK(detail::matmul_operand_copies() == before + 1);
}

TEST_CASE("float32 agrees with float64") {
    Tensor a = randn_seeded({48, 96}, 49), b = randn_seeded({80, 96}, 50).t();
    Tensor y64 = matmul(a, b), y32 = matmul(a.to(kF32), b.to(kF32));
    // Inputs rounded to float32 (rel 6e-8) and float accumulation over K = 96 terms of size ~1:
    // errors of a few 1e-6 around |y| ~ 10.
    CHECK(max_abs_diff(y32, y64) < 1e-4);
    CHECK(y32.dtype() == kF32);
}

TEST_CASE("matmul gradients match finite differences") {
    Tensor a = leaf({3, 4}, 51), b = leaf({4, 5}, 52), at = leaf({4, 3}, 53), bt = leaf({5, 4}, 54);
    CHECK_GRADCHECK([&] { return matmul(a, b); }, {a, b});
    CHECK_GRADCHECK([&] { return matmul(at.t(), bt.t()); }, {at, bt});
    CHECK_GRADCHECK([&] { return matmul(a, bt.t()); }, {a, bt});
    Tensor wide = leaf({3, 7}, 55);
    CHECK_GRADCHECK([&] { return matmul(wide.narrow(1, 2, 4), b); }, {wide, b});
}

TEST_CASE("batched gradients sum over the broadcast batch dims") {
    Tensor a3 = leaf({2, 3, 4}, 56), b3 = leaf({2, 4, 5}, 57), b2 = leaf({4, 5}, 58);
    Tensor a1 = leaf({1, 3, 4}, 59), b4 = leaf({3, 1, 4, 5}, 60), a2 = leaf({3, 4}, 61);
    Tensor w = leaf({5, 4}, 62), xt = leaf({2, 4, 3}, 63);
    CHECK_GRADCHECK([&] { return matmul(a3, b3); }, {a3, b3});
    CHECK_GRADCHECK([&] { return matmul(a3, b2); }, {a3, b2});    // dB folds the batch into K
    CHECK_GRADCHECK([&] { return matmul(a3, w.t()); }, {a3, w});  // the Linear layer
    CHECK_GRADCHECK([&] { return matmul(xt.transpose(1, 2), b2); }, {xt, b2});
    CHECK_GRADCHECK([&] { return matmul(a1, b3); }, {a1, b3});  // size-1 batch dim
    CHECK_GRADCHECK([&] { return matmul(a3, b4); }, {a3, b4});  // both broadcast
    CHECK_GRADCHECK([&] { return matmul(a2, b4); }, {a2, b4});  // a missing batch dims
    CHECK_GRADCHECK([&] { return matmul(b3.transpose(1, 2), a3.transpose(1, 2)); }, {a3, b3});
}

TEST_CASE("only inputs that require grad get a gradient") {
    Tensor x = leaf({2, 3, 4}, 64), w = randn_seeded({5, 4}, 65);  // w: a constant
    matmul(x, w.t()).backward(ones({2, 3, 5}, kF64));
    CHECK(x.grad().defined());
    CHECK(max_abs_diff(x.grad(), matmul(ones({2, 3, 5}, kF64), w)) < 1e-12);
    Tensor c = randn_seeded({3, 4}, 66), v = leaf({4, 2}, 67);
    matmul(c, v).backward(ones({3, 2}, kF64));
    CHECK(v.grad().defined());
    CHECK(max_abs_diff(v.grad(), matmul(c.t(), ones({3, 2}, kF64))) < 1e-12);
}

TEST_CASE("matmul bad inputs name the op and both shapes") {
    Tensor a = zeros({4, 3}), b = zeros({5, 2});
    CHECK(test::throws_with([&] { matmul(a, b); }, {"matmul", "inner", "[4, 3]", "[5, 2]"}));
    CHECK(test::throws_with(
        [&] {
            matmul(zeros({3}), zeros({3, 2}));
        },
        {"matmul", "rank", "[3]", "[3, 2]"}));
    CHECK(test::throws_with(
        [&] {
            matmul(zeros({2, 3}), zeros({3}));
        },
        {"matmul", "rank", "[2, 3]", "[3]"}));
    CHECK(test::throws_with(
        [&] {
            matmul(zeros({2, 4, 3}), zeros({3, 3, 2}));
        },
        {"matmul", "batch", "[2, 4, 3]", "[3, 3, 2]"}));
    CHECK(test::throws_with(
        [&] {
            matmul(zeros({2, 3}), zeros({3, 2}, kF64));
        },
        {"matmul", "float32", "float64", "[2, 3]", "[3, 2]"}));
    CHECK(test::throws_with(
        [&] {
            matmul(from_ids({1, 2, 3, 4}, {2, 2}), from_ids({1, 2, 3, 4}, {2, 2}));
        },
        {"matmul", "int32", "[2, 2]"}));
    CHECK(test::throws_with([&] { matmul(Tensor(), b); }, {"matmul", "undefined"}));
}

TEST_CASE("gradients come back in their input's layout: W.t() and kᵀ get contiguous gradients") {
    // The Linear case: W is read as the transposed view W.t(); its gradient is made as a
    // row-major (out, in) matrix, so the leaf keeps it without a copy.
    Tensor x = leaf({2, 3, 4}, 68), w = leaf({5, 4}, 69);
    matmul(x, w.t()).backward(randn_seeded({2, 3, 5}, 70));
    CHECK(w.grad().is_contiguous());
    CHECK(max_abs_diff(w.grad(), matmul(randn_seeded({2, 3, 5}, 70).reshape({6, 5}).t(),
                                        x.detach().reshape({6, 4}))) < 1e-12);
    // Attention's q · kᵀ: k's gradient arrives contiguous (B, T, D), not as a transposed view.
    Tensor q = leaf({2, 3, 4}, 71), k = leaf({2, 3, 4}, 72);
    Tensor kt = k.transpose(1, 2);
    Tensor s = matmul(q, kt);
    Tensor dk;
    {
        Tensor ds = randn_seeded({2, 3, 3}, 73);
        s.backward(ds);
        dk = matmul(ds.transpose(1, 2), q.detach());  // dk = dsᵀ · q
    }
    CHECK(k.grad().is_contiguous());
    CHECK(max_abs_diff(k.grad(), dk) < 1e-12);
    Tensor at = leaf({4, 3}, 74), b = leaf({4, 5}, 75);  // a transposed a: its gradient too
    CHECK_GRADCHECK([&] { return matmul(at.t(), b); }, {at, b});
}

// linear(x, W, b) against the two-op form it fuses, matmul(x, W.t()) + b, in float64.
TEST_CASE("linear matches matmul(x, W.t()) + b, forward and gradients") {
    Tensor w = leaf({5, 4}, 76), b = leaf({5}, 77), x_base = leaf({4, 6}, 78);
    Tensor x_t = x_base.t();               // rows that do not merge: read through a copy
    auto two_ops = [&](const Tensor& x) {  // matmul needs rank >= 2: a 1-D x is one row
        return x.dim() == 1 ? matmul(x.unsqueeze(0), w.t()).squeeze(0) : matmul(x, w.t());
    };
    for (Tensor x : {leaf({2, 3, 4}, 79), leaf({4}, 80), x_t}) {
        INFO("x ", x.shape(), " strides ", x.strides());
        CHECK(max_abs_diff(linear(x, w, b), two_ops(x) + b) < 1e-12);
        CHECK(max_abs_diff(linear(x, w), two_ops(x)) < 1e-12);
    }
    Tensor x3 = leaf({2, 3, 4}, 81), x1 = leaf({4}, 82);
    CHECK_GRADCHECK([&] { return linear(x3, w, b); }, {x3, w, b});
    CHECK_GRADCHECK([&] { return linear(x3, w); }, {x3, w});
    CHECK_GRADCHECK([&] { return linear(x1, w, b); }, {x1, w, b});
    CHECK_GRADCHECK([&] { return linear(x_t, w, b); }, {x_base, w, b});
    Tensor x32 = randn_seeded({6, 4}, 83, kF32), w32 = randn_seeded({5, 4}, 84, kF32),
           b32 = randn_seeded({5}, 85, kF32);
    CHECK(max_abs_diff(linear(x32, w32, b32), matmul(x32, w32.t()) + b32) < 1e-5);
    Tensor x0 = zeros({3, 0}, kF64), w0 = zeros({2, 0}, kF64), b0 = from_vector({1, 2}, {2}, kF64);
    CHECK(linear(x0, w0, b0).to_vector<double>() == std::vector<double>{1, 2, 1, 2, 1, 2});
    CHECK(linear(x0, w0).to_vector<double>() == std::vector<double>(6, 0.0));
    x0.requires_grad_(), w0.requires_grad_(), b0.requires_grad_();
    linear(x0, w0, b0).backward(ones({3, 2}, kF64));  // an empty inner dim: only db is nonzero
    CHECK(b0.grad().to_vector<double>() == std::vector<double>{3, 3});
    CHECK(x0.grad().shape() == Shape{3, 0});
}

TEST_CASE("linear_gelu is gelu(linear(...)): values, gradients, and the same refusals") {
    Tensor w = leaf({5, 4}, 86), b = leaf({5}, 87), x = leaf({2, 3, 4}, 88);
    CHECK(max_abs_diff(linear_gelu(x, w, b, Precision::full), gelu(linear(x, w, b))) == 0);
    CHECK_GRADCHECK([&] { return linear_gelu(x, w, b, Precision::full); }, {x, w, b});
    CHECK_GRADCHECK([&] { return linear_gelu(x, w, {}, Precision::full); }, {x, w});
    // bf16 on the cpu: the two ops' own kernels, so the same bits.
    Tensor x32 = randn_seeded({6, 4}, 89, kF32), w32 = randn_seeded({5, 4}, 90, kF32);
    CHECK(max_abs_diff(linear_gelu(x32, w32, {}, Precision::bf16, Precision::bf16),
                       gelu(linear(x32, w32, {}, Precision::bf16))) == 0);
    CHECK(test::throws_with(
        [&] {
            linear_gelu(zeros({2, 3}), zeros({4, 5}), {}, Precision::bf16);
        },
        {"linear", "[2, 3]", "[4, 5]"}));
    CHECK(test::throws_with(
        [&] {
            linear_gelu(zeros({2, 3}), zeros({4, 3}), {}, Precision::fp8);
        },
        {"linear", "fp8", "linear_fp8"}));
}

TEST_CASE("linear_gelu_linear is linear(gelu(linear(...))): values, gradients, refusals") {
    Tensor w1 = leaf({5, 4}, 91), b1 = leaf({5}, 92), w2 = leaf({3, 5}, 93), b2 = leaf({3}, 94),
           x = leaf({2, 3, 4}, 95);
    CHECK(max_abs_diff(linear_gelu_linear(x, w1, b1, w2, b2, Precision::full),
                       linear(gelu(linear(x, w1, b1)), w2, b2)) == 0);
    CHECK_GRADCHECK([&] { return linear_gelu_linear(x, w1, b1, w2, b2, Precision::full); },
                    {x, w1, b1, w2, b2});
    CHECK_GRADCHECK([&] { return linear_gelu_linear(x, w1, {}, w2, {}, Precision::full); },
                    {x, w1, w2});
    // bf16 on the cpu: the two ops' own kernels, so the same bits.
    Tensor x32 = randn_seeded({6, 4}, 96, kF32), w1_32 = randn_seeded({5, 4}, 97, kF32),
           w2_32 = randn_seeded({3, 5}, 98, kF32);
    CHECK(max_abs_diff(linear_gelu_linear(x32, w1_32, {}, w2_32, {}, Precision::bf16),
                       linear(linear_gelu(x32, w1_32, {}, Precision::bf16, Precision::bf16), w2_32,
                              {}, Precision::bf16)) == 0);
    CHECK(test::throws_with(
        [&] {
            linear_gelu_linear(zeros({2, 4}), zeros({5, 4}), {}, zeros({3, 6}), {},
                               Precision::full);
        },
        {"linear_gelu_linear", "w_proj", "[5, 4]", "[3, 6]"}));
    CHECK(test::throws_with(
        [&] {
            linear_gelu_linear(zeros({2, 4}), zeros({5, 4}), {}, zeros({3, 5}), zeros({4}),
                               Precision::full);
        },
        {"linear_gelu_linear", "b_proj", "[4]", "[3, 5]"}));
}

TEST_CASE("glu_linear is linear(glu(linear(x, w_gate), linear(x, w_up))): values, gradients") {
    Tensor wg = leaf({5, 4}, 101), wu = leaf({5, 4}, 102), w2 = leaf({3, 5}, 103),
           b2 = leaf({3}, 104), x = leaf({2, 3, 4}, 105);
    for (GluActivation act : {GluActivation::silu, GluActivation::gelu}) {
        CHECK(max_abs_diff(glu_linear(x, wg, wu, w2, b2, act, Precision::full),
                           linear(glu(linear(x, wg), linear(x, wu), act), w2, b2)) == 0);
        CHECK_GRADCHECK([&] { return glu_linear(x, wg, wu, w2, b2, act, Precision::full); },
                        {x, wg, wu, w2, b2});
    }
    CHECK(test::throws_with(
        [&] {
            glu_linear(zeros({2, 4}), zeros({5, 4}), zeros({6, 4}), zeros({3, 5}), {},
                       GluActivation::silu, Precision::full);
        },
        {"glu_linear", "w_gate", "[5, 4]", "[6, 4]"}));
    CHECK(test::throws_with(
        [&] {
            glu_linear(zeros({2, 4}), zeros({5, 4}), zeros({5, 4}), zeros({3, 4}), {},
                       GluActivation::silu, Precision::full);
        },
        {"glu_linear", "w_proj", "[3, 4]"}));
}

TEST_CASE("linear bad inputs name the op and the shapes") {
    CHECK(test::throws_with(
        [&] {
            linear(zeros({2, 3}), zeros({4, 5}));
        },
        {"linear", "[2, 3]", "[4, 5]", "(out_features, 3)"}));
    CHECK(test::throws_with(
        [&] {
            linear(zeros({2, 3}), zeros({4, 3}), zeros({5}));
        },
        {"linear", "bias", "[5]", "[4]"}));
    CHECK(test::throws_with(
        [&] {
            linear(zeros({2, 3}), zeros({4, 3}, kF64));
        },
        {"linear", "float32", "float64"}));
}

TEST_CASE("GEMMs split over threads match the naive loop") {
    // Large enough to be split (rows of y when M >= N, columns otherwise), in every transpose
    // layout, plus a batch of small GEMMs that go to the threads whole. float64 is held to the
    // naive loop; float32 to float64's result, within float32's rounding over K = 130 terms.
    struct Case {
        Shape a, b;
        bool ta, tb;
    };
    const std::vector<Case> cases = {
        {{301, 130}, {130, 97}, false, false},           // M > N: rows
        {{97, 130}, {130, 301}, false, false},           // N > M: columns
        {{130, 301}, {97, 130}, true, true},             // both transposed, rows
        {{130, 97}, {301, 130}, true, true},             // both transposed, columns
        {{7, 6, 37, 33}, {7, 6, 33, 29}, false, false},  // 42 small GEMMs
        // 3 GEMMs each large enough to split: whole per thread at 2 and 3 threads (n >= threads),
        // like attention's B·H products, and split at 4 (fewer than threads)
        {{3, 131, 90}, {3, 90, 101}, false, false},
        {{3, 90, 131}, {3, 101, 90}, true, true},
    };
    const int saved = num_threads();
    for (const Case& c : cases) {
        Tensor a = randn_seeded(c.a, 61), b = randn_seeded(c.b, 62);
        if (c.ta) a = a.transpose(-2, -1);
        if (c.tb) b = b.transpose(-2, -1);
        for (int threads : {1, 2, 3, 4}) {
            set_num_threads(threads);
            INFO("a ", a.shape(), ", b ", b.shape(), ", ", threads, " threads");
            check_forward(a, b);
            Tensor y32 = matmul(a.to(kF32), b.to(kF32));
            CHECK(max_abs_diff(y32, matmul_ref(a, b)) < 1e-4);
        }
        set_num_threads(saved);
    }
    // Heads as views into (B, T, H, D), as attention's q·kᵀ and A·v: a batch (B, H) whose
    // offsets are not one run of strides, given out item by item over the whole batch.
    const Tensor q = randn_seeded({5, 37, 6, 33}, 63).transpose(1, 2);
    const Tensor k = randn_seeded({5, 29, 6, 33}, 64).transpose(1, 2);
    for (int threads : {1, 2, 3, 4}) {
        set_num_threads(threads);
        INFO(threads, " threads");
        check_forward(q, k.transpose(-2, -1));             // (5, 6, 37, 29)
        check_forward(matmul(q, k.transpose(-2, -1)), k);  // (5, 6, 37, 33)
    }
    set_num_threads(saved);
}

TEST_CASE("linear's forward with a bias, split over threads by rows and by columns") {
    // Split by rows when the output is taller than wide, by columns when wider (M = 97 < N =
    // 301): each column slab must take the bias entries of its own columns. float64 and float32
    // (the bf16-free path), held to the naive loop.
    for (auto [rows, outputs] : {std::pair<int64_t, int64_t>{301, 97}, {97, 301}}) {
        const Tensor x = randn_seeded({rows, 130}, 91), w = randn_seeded({outputs, 130}, 92);
        const Tensor b = randn_seeded({outputs}, 93);
        const Tensor want = matmul_ref(x, w.t()) + b;
        for (int threads : {1, 2, 3, 4}) {
            const test::ThreadCount scope(threads);
            INFO("x (", rows, ", 130), W (", outputs, ", 130), ", threads, " threads");
            CHECK(max_abs_diff(linear(x, w, b), want) < 1e-11);
            CHECK(max_abs_diff(linear(x.to(kF32), w.to(kF32), b.to(kF32)), want) < 1e-3);
        }
    }
}

TEST_CASE("linear's dx and dW, computed side by side on the threads, match the naive loop") {
    // Large enough that dx = dY·W and dW = dYᵀ·x share one parallel region (each on half of the
    // threads at 2 and 4 threads; one after the other at 1 and 3), with x and dY as views that
    // GEMM reads through their leading dimensions. float64, held to the naive loop.
    Tensor x_base = randn_seeded({2, 151, 130}, 65), w = randn_seeded({97, 120}, 66);
    Tensor x = x_base.narrow(-1, 5, 120), b = randn_seeded({97}, 67);
    Tensor dy = randn_seeded({2, 151, 97}, 68);
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_();
    const Tensor dy_rows = dy.reshape({302, 97}), x_rows = x.detach().reshape({302, 120});
    const Tensor dx_ref = matmul_ref(dy_rows, w.detach()).reshape(x.shape());
    const Tensor dw_ref = matmul_ref(dy_rows.t(), x_rows);
    const int saved = num_threads();
    for (int threads : {1, 2, 3, 4}) {
        set_num_threads(threads);
        INFO(threads, " threads");
        x.zero_grad(), w.zero_grad(), b.zero_grad();
        linear(x, w, b).backward(dy);
        CHECK(max_abs_diff(x.grad(), dx_ref) < 1e-11);
        CHECK(max_abs_diff(w.grad(), dw_ref) < 1e-11);
    }
    set_num_threads(saved);
}
