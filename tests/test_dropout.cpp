// Dropout: statistics on 100k elements, reproducibility from a seed, the backward reusing the
// forward's mask, a float64 gradcheck (the mask redrawn from a fresh generator on every call),
// the identity and p == 1 edge cases, bad inputs.
#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;
using qk::test::ThreadCount;

TEST_CASE("dropout zeroes a fraction p and preserves the mean") {
    const int64_t n = 100000;
    for (double p : {0.1, 0.3, 0.5, 0.9}) {
        CAPTURE(p);
        Generator gen(42);
        auto y = dropout(ones({n}), p, true, gen).to_vector<float>();
        const float scale = static_cast<float>(1 / (1 - p));
        int64_t zeros_seen = 0, other_values = 0;
        double total = 0;
        for (float v : y) {
            zeros_seen += v == 0;
            other_values += v != 0 && v != scale;  // kept elements are scaled by exactly 1/(1-p)
            total += v;
        }
        CHECK(other_values == 0);
        // Binomial standard deviation of the fraction: sqrt(p (1 - p) / n) <= 0.0016, so 0.01 is
        // over six of them; the mean's deviation is that times 1 / (1 - p).
        CHECK(std::abs(double(zeros_seen) / n - p) < 0.01);
        CHECK(std::abs(total / n - 1) < 0.01 / (1 - p));
    }
}

TEST_CASE("dropout is reproducible from a seed, on any layout and thread count") {
    Tensor x = leaf({300, 400}, 1).detach();  // big enough to take the parallel path
    Generator g1(7), g2(7), g3(8);
    Tensor a = dropout(x, 0.25, true, g1), b = dropout(x, 0.25, true, g2);
    CHECK(max_abs_diff(a, b) == 0);
    CHECK(max_abs_diff(a, dropout(x, 0.25, true, g3)) > 0);  // another seed, another mask
    CHECK(max_abs_diff(a, dropout(x, 0.25, true, g1)) > 0);  // the generator moved on...
    CHECK(g1.counter() == 2 * (300 * 400 / 4));              // by one word per element
    {
        ThreadCount two(2);
        Generator g(7);
        CHECK(max_abs_diff(a, dropout(x, 0.25, true, g)) == 0);
    }
    // The mask follows the row-major order of the logical shape, not the memory layout.
    Tensor xt = x.t();
    Generator h1(9), h2(9);
    CHECK(max_abs_diff(dropout(xt, 0.5, true, h1), dropout(xt.contiguous(), 0.5, true, h2)) == 0);
    // The default generator is seeded by manual_seed.
    manual_seed(3);
    Tensor d1 = dropout(x, 0.5, true);
    manual_seed(3);
    CHECK(max_abs_diff(d1, dropout(x, 0.5, true)) == 0);
}

TEST_CASE("dropout backward reuses the forward's mask") {
    Tensor x = ones({5, 6}, kF32).requires_grad_();
    Generator gen(11), dy_gen(12);
    Tensor y = dropout(x, 0.4, true, gen);  // y = keep * s, since x = 1
    Tensor dy = randn({5, 6}, kF32, dy_gen);
    y.backward(dy);
    CHECK(max_abs_diff(x.grad(), dy * y.detach()) == 0);  // dx = dy * keep * s
}

TEST_CASE("dropout gradient matches finite differences") {
    Tensor x = leaf({6, 5}, 13);
    // A fresh generator per call: every evaluation draws the same mask.
    CHECK_GRADCHECK(
        [&] {
            Generator gen(14);
            return dropout(x, 0.3, true, gen);
        },
        {x});
    CHECK_GRADCHECK(
        [&] {
            Generator gen(15);
            return tanh(dropout(x.t().narrow(0, 1, 3), 0.5, true, gen));
        },
        {x});
}

TEST_CASE("dropout edge cases: eval mode, p == 0, p == 1") {
    Tensor x = leaf({3, 4}, 16);
    Generator gen(17);
    CHECK(dropout(x, 0.5, false, gen).same(x));  // x itself: no copy, no node
    CHECK(dropout(x, 0.0, true, gen).same(x));
    CHECK(gen.counter() == 0);  // and no random numbers spent
    Tensor y = dropout(x, 1.0, true, gen);
    CHECK(max_abs_diff(y, zeros({3, 4}, kF64)) == 0);  // everything dropped, no 1/0
    sum(y * 3.0).backward();
    CHECK(max_abs_diff(x.grad(), zeros({3, 4}, kF64)) == 0);
}

TEST_CASE("dropout bad inputs name the op and the value") {
    Tensor x = zeros({2, 3});
    CHECK(
        test::throws_with([&] { dropout(x, 1.5, true); }, {"dropout", "[0, 1]", "1.5", "[2, 3]"}));
    CHECK(test::throws_with([&] { dropout(x, -0.1, false); }, {"dropout", "[0, 1]", "-0.1"}));
    CHECK(test::throws_with([&] { dropout(x, std::nan(""), true); }, {"dropout", "nan"}));
    CHECK(test::throws_with([&] { dropout(from_ids({1, 2}), 0.5, true); }, {"dropout", "int32"}));
}
