// Reductions: forward against naive loops, float64 gradchecks, bad inputs.
#include "helpers.h"

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
}
