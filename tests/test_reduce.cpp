// Reductions: forward against naive loops, float64 gradchecks (incl. transposed inputs and the
// max tie rule), -inf and large inputs, bad inputs.
#include <algorithm>
#include <limits>

#include "helpers.h"
#include "ops/elementwise_math.h"  // math::exp_fast (internal: not in qk.h)

using namespace qk;
using qk::test::leaf;

TEST_CASE("sum and mean over dims, keepdim or not") {
    Tensor x = arange(24, kF64).view({2, 3, 4});
    Tensor s = sum(x, {1});
    CHECK(s.shape() == Shape{2, 4});
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t k = 0; k < 4; ++k) {
            double ref = 0;
            for (int64_t j = 0; j < 3; ++j) ref += x.at({i, j, k});
            CHECK(s.at({i, k}) == ref);
        }
    CHECK(sum(x, {0, -1}, true).shape() == Shape{1, 3, 1});
    CHECK(sum(x, {0, -1}).at({2}) == (8 + 9 + 10 + 11) + (20 + 21 + 22 + 23));
    CHECK(sum(x).item() == 276);
    CHECK(sum(x).dim() == 0);
    CHECK(mean(x, {2}).at({1, 2}) == doctest::Approx(21.5));
    CHECK(sum(x.t(), {0}).at({1, 2}) == sum(x, {0}).at({2, 1}));
}

TEST_CASE("sum_to inverts broadcasting") {
    Tensor x = ones({2, 3, 4}, kF64);
    CHECK(sum_to(x, {3, 1}).to_vector<double>() == std::vector<double>{8, 8, 8});
    CHECK(sum_to(x, {4}).to_vector<double>() == std::vector<double>{6, 6, 6, 6});
    CHECK(sum_to(x, {2, 3, 4}).same(x));
}

TEST_CASE("reduction gradients") {
    Tensor x = leaf({3, 4, 5}, 11);
    CHECK_GRADCHECK([&] { return sum(x, {1}); }, {x});
    CHECK_GRADCHECK([&] { return sum(x, {0, 2}, true); }, {x});
    CHECK_GRADCHECK([&] { return mean(x.transpose(0, 2), {-1}); }, {x});
    CHECK_GRADCHECK([&] { return sum_to(x, {4, 1}); }, {x});
    CHECK_GRADCHECK([&] { return sum(x); }, {x});
}

TEST_CASE("reduction bad inputs") {
    Tensor x = zeros({2, 3});
    CHECK(test::throws_with([&] { sum(x, {2}); }, {"sum", "dim 2", "rank 2"}));
    CHECK(test::throws_with([&] { sum(x, {1, -1}); }, {"sum", "twice"}));
    CHECK(test::throws_with([&] { sum_to(x, {4}); }, {"sum_to", "[4]", "[2, 3]"}));
    const Tensor ids = from_ids({1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(test::throws_with([&] { sum(ids); }, {"sum", "float32 or float64", "int32", "[2, 3]"}));
    CHECK(test::throws_with([&] { mean(ids, {0}); }, {"mean", "int32", "[2, 3]"}));
    CHECK(test::throws_with([&] { sum_to(ids, {3}); }, {"sum_to", "int32", "[2, 3]"}));
}

// ---- max, var, logsumexp -------------------------------------------------------------------

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Naive reference: reduce x (shape [A, B, C], read through at()) over dim 1 with f.
template <class F>
std::vector<double> reduce_dim1(const Tensor& x, double init, F f) {
    std::vector<double> out;
    for (int64_t a = 0; a < x.size(0); ++a)
        for (int64_t c = 0; c < x.size(2); ++c) {
            double acc = init;
            for (int64_t b = 0; b < x.size(1); ++b) acc = f(acc, x.at({a, b, c}));
            out.push_back(acc);
        }
    return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(tol));
}

}  // namespace

TEST_CASE("max matches a naive loop, on contiguous and transposed inputs") {
    Tensor x = leaf({3, 4, 5}, 21).detach();
    auto mx = [](double a, double v) { return std::max(a, v); };
    CHECK(max(x, {1}).shape() == Shape{3, 5});
    CHECK(max(x, {1}).to_vector<double>() == reduce_dim1(x, -kInf, mx));
    CHECK(max(x, {1}, true).shape() == Shape{3, 1, 5});
    // x.transpose(0, 2) has shape [5, 4, 3]; reducing its dim 1 reads x with strides (1, 5, 20)
    Tensor xt = x.transpose(0, 2);
    CHECK(max(xt, {1}).to_vector<double>() == reduce_dim1(xt, -kInf, mx));
    const auto xs = x.to_vector<double>();
    CHECK(max(x).item() == *std::max_element(xs.begin(), xs.end()));
    CHECK(max(x, {0, 2}).shape() == Shape{4});
}

TEST_CASE("max tie rule: the gradient is split evenly among tied maxima") {
    Tensor x = from_vector({1, 3, 3, 2, 0, 2, 5, 5, 5}, {3, 3}, kF64);
    x.requires_grad_();
    Tensor y = max(x, {1});
    CHECK(y.to_vector<double>() == std::vector<double>{3, 2, 5});
    y.backward(from_vector({1, 4, 3}, {3}, kF64));
    CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 2, 0, 2, 1, 1, 1});
    x.zero_grad();
    max(x).backward();  // one global max, 5, tied three times
    CHECK(x.grad().to_vector<double>() ==
          std::vector<double>{0, 0, 0, 0, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3});
}

TEST_CASE("max propagates NaN and gives it no gradient") {
    Tensor x = from_vector({1, NAN, 3, 4, 5, 6}, {2, 3}, kF64);
    x.requires_grad_();
    Tensor y = max(x, {1});
    CHECK(std::isnan(y.at({0})));
    CHECK(y.at({1}) == 6);
    y.backward(ones({2}, kF64));
    CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0, 0, 1});
}

TEST_CASE("var matches a naive two-pass loop, with either correction") {
    Tensor x = leaf({3, 4, 5}, 22).detach() * 3.0 + 100.0;  // an offset that E[x²]−E[x]² would feel
    for (int64_t correction : {0, 1}) {
        std::vector<double> want;
        for (int64_t a = 0; a < 3; ++a)
            for (int64_t c = 0; c < 5; ++c) {
                double mu = 0, ss = 0;
                for (int64_t b = 0; b < 4; ++b) mu += x.at({a, b, c}) / 4;
                for (int64_t b = 0; b < 4; ++b)
                    ss += (x.at({a, b, c}) - mu) * (x.at({a, b, c}) - mu);
                want.push_back(ss / double(4 - correction));
            }
        check_close(var(x, {1}, false, correction).to_vector<double>(), want, 1e-12);
    }
    CHECK(var(x, {1}, true).shape() == Shape{3, 1, 5});
    CHECK(var(from_vector({1, 2, 3, 4}, {4}, kF64)).item() == doctest::Approx(5.0 / 3));
}

TEST_CASE("logsumexp matches a naive loop and is stable at large and -inf inputs") {
    Tensor x = leaf({3, 4, 5}, 23).detach();
    auto naive = [](const Tensor& t) {
        auto m = reduce_dim1(t, -kInf, [](double a, double v) { return std::max(a, v); });
        std::vector<double> out;
        size_t k = 0;
        for (int64_t a = 0; a < t.size(0); ++a)
            for (int64_t c = 0; c < t.size(2); ++c, ++k) {
                double s = 0;
                for (int64_t b = 0; b < t.size(1); ++b) s += std::exp(t.at({a, b, c}) - m[k]);
                out.push_back(m[k] + std::log(s));
            }
        return out;
    };
    check_close(logsumexp(x, {1}).to_vector<double>(), naive(x), 1e-13);
    check_close(logsumexp(x.transpose(0, 2), {1}).to_vector<double>(), naive(x.transpose(0, 2)),
                1e-13);
    // 1e4 would overflow exp without the max shift; float32 too
    Tensor big = x * 1e4;
    check_close(logsumexp(big, {1}).to_vector<double>(), naive(big), 1e-13);
    check_close(logsumexp(big.to(kF32), {1}).to_vector<double>(), naive(big), 1e-6);
    // logsumexp of (a, a) is a + log 2
    CHECK(logsumexp(from_vector({7, 7}, {2}, kF64)).item() == doctest::Approx(7 + std::log(2.0)));
}

TEST_CASE("logsumexp of an all -inf group is -inf, with zero gradient and no NaN") {
    Tensor x = from_vector({-kInf, -kInf, -kInf, 0, -kInf, 1}, {2, 3}, kF64);
    x.requires_grad_();
    Tensor y = logsumexp(x, {1});
    CHECK(y.at({0}) == -kInf);
    CHECK(y.at({1}) == doctest::Approx(std::log(1 + std::exp(1.0))));
    y.backward(ones({2}, kF64));
    auto g = x.grad().to_vector<double>();
    const double p1 = std::exp(1.0) / (1 + std::exp(1.0));
    CHECK(g[0] == 0);
    CHECK(g[1] == 0);
    CHECK(g[2] == 0);
    CHECK(g[3] == doctest::Approx(1 - p1));
    CHECK(g[4] == 0);
    CHECK(g[5] == doctest::Approx(p1));
}

TEST_CASE("max, var, logsumexp gradients") {
    Tensor x = leaf({3, 4, 5}, 24);  // continuous draws: no ties, away from max's kinks
    CHECK_GRADCHECK([&] { return max(x, {1}); }, {x});
    CHECK_GRADCHECK([&] { return max(x.transpose(0, 2), {0, 2}, true); }, {x});
    CHECK_GRADCHECK([&] { return var(x, {1}); }, {x});
    CHECK_GRADCHECK([&] { return var(x.transpose(1, 2), {0, -1}, true, 0); }, {x});
    CHECK_GRADCHECK([&] { return var(x); }, {x});
    CHECK_GRADCHECK([&] { return logsumexp(x, {1}); }, {x});
    CHECK_GRADCHECK([&] { return logsumexp(x.transpose(0, 2), {0, 1}, true); }, {x});
    CHECK_GRADCHECK([&] { return logsumexp(x * 30.0); }, {x});
}

TEST_CASE("sum and mean accept a non-contiguous upstream gradient and empty outputs") {
    Tensor x = leaf({3, 4, 5}, 25);
    // y.t() makes the gradient reaching sum's backward a transposed (non-contiguous) tensor
    CHECK_GRADCHECK([&] { return sum(x, {0}).t(); }, {x});
    CHECK_GRADCHECK([&] { return mean(x, {1}, true).transpose(0, 2); }, {x});
    CHECK(mean(zeros({0, 3}, kF64), {1}).shape() == Shape{0});
}

TEST_CASE("max, var, logsumexp bad inputs") {
    Tensor x = zeros({2, 3});
    CHECK(test::throws_with([&] { max(x, {2}); }, {"max", "dim 2", "rank 2"}));
    CHECK(test::throws_with([&] { logsumexp(x, {0, -2}); }, {"logsumexp", "twice"}));
    CHECK(test::throws_with([&] { max(zeros({0, 3}), {0}); }, {"max", "[0, 3]", "zero elements"}));
    CHECK(test::throws_with([&] { max(from_ids({1, 2})); }, {"max", "int32", "[2]"}));
    CHECK(test::throws_with([&] { var(x, {0}, false, 2); },
                            {"var", "[2, 3]", "2 elements", "correction 2"}));
    CHECK(
        test::throws_with([&] { var(zeros({1})); }, {"var", "[1]", "1 elements", "correction 1"}));
    CHECK(test::throws_with([&] { logsumexp(from_ids({1})); }, {"logsumexp", "int32"}));
}

TEST_CASE("math::exp_fast (float) is within 2 ulp of exp, and keeps 0, inf and NaN") {
    double worst = 0;
    for (float x = -87.0f; x < 88.0f; x += 0.00731f) {
        const double want = std::exp(double(x));
        worst = std::max(worst, std::abs(math::exp_fast(x) - want) / want);
    }
    CHECK(worst < 2 * 5.96e-8);  // 2 ulp (float's unit roundoff is 2^-24)
    CHECK(math::exp_fast(0.0f) == 1.0f);
    CHECK(math::exp_fast(-std::numeric_limits<float>::infinity()) == 0.0f);
    CHECK(math::exp_fast(-100.0f) == 0.0f);
    CHECK(math::exp_fast(std::numeric_limits<float>::infinity()) ==
          std::numeric_limits<float>::infinity());
    CHECK(std::isnan(math::exp_fast(std::numeric_limits<float>::quiet_NaN())));
    CHECK(math::exp_fast(0.5) == std::exp(0.5));  // double: std::exp itself
}
