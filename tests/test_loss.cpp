// cross_entropy: the fused kernel against a naive double loop and against the composite
// -mean(log_softmax(x)[t]), float64 gradchecks (with ignored rows, transposed logits), the
// backward's closed form, stability at large logits, and bad inputs.
#include <cmath>
#include <vector>

#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;

namespace {

// Naive reference in double: mean over rows with t != ignore of lse_i - x[i, t_i].
double naive_cross_entropy(const Tensor& x, const std::vector<int32_t>& t, int32_t ignore) {
    double total = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < x.size(0); ++i) {
        if (t[i] == ignore) continue;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < x.size(1); ++j) m = std::max(m, x.at({i, j}));
        for (int64_t j = 0; j < x.size(1); ++j) s += std::exp(x.at({i, j}) - m);
        total += m + std::log(s) - x.at({i, t[i]});
        ++n;
    }
    return total / double(n);
}

// A (N, V) float64 tensor with 1 at (i, t_i) for valid rows, 0 elsewhere.
Tensor one_hot(const std::vector<int32_t>& t, int64_t V, int32_t ignore) {
    Tensor h = zeros({int64_t(t.size()), V}, kF64);
    for (size_t i = 0; i < t.size(); ++i)
        if (t[i] != ignore) h.set({int64_t(i), t[i]}, 1);
    return h;
}

// Composite reference: -Σ (onehot ⊙ log_softmax(x)) / n_valid, differentiable through the ops.
Tensor cross_entropy_composite(const Tensor& x, const std::vector<int32_t>& t, int32_t ignore) {
    Tensor h = one_hot(t, x.size(1), ignore);
    return -sum(h * log_softmax(x)) / sum(h).item();
}

}  // namespace

TEST_CASE("cross_entropy matches a naive loop and the composite, with ignored rows") {
    const std::vector<int32_t> t = {3, -1, 0, 4, 4, -1, 2};
    Tensor x = leaf({7, 5}, 1, 2.0).detach();
    CHECK(cross_entropy(x, from_ids(t)).dim() == 0);
    CHECK(cross_entropy(x, from_ids(t)).item() ==
          doctest::Approx(naive_cross_entropy(x, t, -1)).epsilon(1e-14));
    CHECK(cross_entropy(x, from_ids(t)).item() ==
          doctest::Approx(cross_entropy_composite(x, t, -1).item()).epsilon(1e-14));
    // another ignore_index: rows with target 4 drop out, -1 is then out of range
    const std::vector<int32_t> t4 = {3, 1, 0, 4, 4, 2, 2};
    CHECK(cross_entropy(x, from_ids(t4), 4).item() ==
          doctest::Approx(naive_cross_entropy(x, t4, 4)).epsilon(1e-14));
    // float32, transposed (non-contiguous) logits
    Tensor xt = leaf({5, 7}, 2, 2.0).detach();
    CHECK(cross_entropy(xt.t().to(kF32), from_ids(t)).item() ==
          doctest::Approx(naive_cross_entropy(xt.t(), t, -1)).epsilon(1e-6));
    CHECK(cross_entropy(x.to(kF32), from_ids(t)).dtype() == kF32);
}

TEST_CASE("cross_entropy is stable at logits of 1e4 and over a 50257 vocabulary") {
    const std::vector<int32_t> t = {0, 2, 1};
    Tensor x = leaf({3, 4}, 3).detach() * 1e4;
    CHECK(cross_entropy(x, from_ids(t)).item() ==
          doctest::Approx(naive_cross_entropy(x, t, -1)).epsilon(1e-14));
    Tensor x32 = x.to(kF32);
    const double got = cross_entropy(x32, from_ids(t)).item();
    CHECK(std::isfinite(got));
    CHECK(got == doctest::Approx(naive_cross_entropy(x32, t, -1)).epsilon(1e-6));

    Tensor big = leaf({2, 50257}, 4, 3.0).detach();
    const std::vector<int32_t> tb = {17, 50256};
    CHECK(cross_entropy(big.to(kF32), from_ids(tb)).item() ==
          doctest::Approx(naive_cross_entropy(big.to(kF32), tb, -1)).epsilon(1e-6));
}

TEST_CASE("cross_entropy backward is (softmax - onehot) · dL / n_valid, zero on ignored rows") {
    const std::vector<int32_t> t = {1, -1, 3, 0};
    Tensor x = leaf({4, 6}, 5, 2.0);
    (cross_entropy(x, from_ids(t)) * 2.5).backward();  // dL = 2.5, n_valid = 3
    Tensor want = (softmax(x.detach()) - one_hot(t, 6, -1)) * (2.5 / 3);
    for (int64_t j = 0; j < 6; ++j) want.set({1, j}, 0);
    CHECK(max_abs_diff(x.grad(), want) < 1e-15);
    for (int64_t j = 0; j < 6; ++j) CHECK(x.grad().at({1, j}) == 0);
    // and against the composite's autograd
    Tensor dx = x.grad();
    x.zero_grad();
    (cross_entropy_composite(x, t, -1) * 2.5).backward();
    CHECK(max_abs_diff(x.grad(), dx) < 1e-15);
}

TEST_CASE("cross_entropy gradients") {
    Tensor x = leaf({6, 5}, 6, 2.0);
    Tensor xt = leaf({5, 6}, 7, 2.0);
    const std::vector<int32_t> t = {0, 4, -1, 2, 2, 1};
    CHECK_GRADCHECK([&] { return cross_entropy(x, from_ids(t)); }, {x});
    CHECK_GRADCHECK([&] { return cross_entropy(xt.t(), from_ids(t)); }, {xt});  // non-contiguous
    CHECK_GRADCHECK([&] { return cross_entropy(x * 20.0, from_ids({0, 4, 3, 2, 2, 1}), 2); }, {x});
}

TEST_CASE("cross_entropy bad inputs") {
    Tensor x = zeros({3, 5});
    CHECK(test::throws_with([&] { cross_entropy(x, zeros({3})); },
                            {"cross_entropy", "int32", "float32 of shape [3]", "[0, 5)"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(x, from_ids({0, 1, 2}, {3, 1}));
        },
        {"cross_entropy", "[3, 1]"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(x, from_ids({0, 1}));
        },
        {"cross_entropy", "[3, 5]", "[2]", "[3]"}));
    CHECK(test::throws_with([&] { cross_entropy(zeros({5}), from_ids({0})); },
                            {"cross_entropy", "(N, V)", "[5]"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(from_ids({0, 1}, {1, 2}), from_ids({0}));
        },
        {"cross_entropy", "int32", "[1, 2]"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(x, from_ids({0, 5, 1}));
        },
        {"cross_entropy", "target 5", "row 1", "[0, 5)"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(x, from_ids({0, 1, -2}));
        },
        {"cross_entropy", "target -2", "row 2", "ignore_index -1"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(x, from_ids({-1, -1, -1}));
        },
        {"cross_entropy", "all 3 targets", "ignore_index -1"}));
    CHECK(test::throws_with(
        [&] {
            cross_entropy(zeros({0, 5}), from_ids(std::vector<int32_t>{}, {0}));
        },
        {"cross_entropy", "all 0 targets"}));
}
