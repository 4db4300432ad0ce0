// Joining and splitting: cat/stack against naive index arithmetic, split/chunk piece sizes and
// view semantics, float64 gradchecks (several dims, non-contiguous inputs, pieces used
// downstream), bad inputs.
#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;

namespace {

Shape sizes_along(const std::vector<Tensor>& pieces, int64_t dim) {
    Shape sizes;
    for (const Tensor& p : pieces) sizes.push_back(p.size(dim));
    return sizes;
}

}  // namespace

TEST_CASE("cat places each input at its offset along dim") {
    Tensor a = leaf({2, 3, 4}, 1).detach();
    Tensor b = leaf({2, 1, 4}, 2).detach();
    Tensor c = leaf({4, 5, 2}, 3).detach().permute({2, 1, 0});  // (2, 5, 4), non-contiguous
    Tensor y = cat({a, b, c}, 1);
    REQUIRE(y.shape() == Shape{2, 9, 4});
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t k = 0; k < 4; ++k) {
            for (int64_t j = 0; j < 3; ++j) CHECK(y.at({i, j, k}) == a.at({i, j, k}));
            CHECK(y.at({i, 3, k}) == b.at({i, 0, k}));
            for (int64_t j = 0; j < 5; ++j) CHECK(y.at({i, 4 + j, k}) == c.at({i, j, k}));
        }
    // First and last dims, with a negative dim.
    Tensor y0 = cat({a, a.narrow(0, 1, 1)}, 0);
    REQUIRE(y0.shape() == Shape{3, 3, 4});
    CHECK(max_abs_diff(y0.narrow(0, 2, 1), a.narrow(0, 1, 1)) == 0);
    Tensor yl = cat({a.transpose(1, 2).contiguous().transpose(1, 2), a}, -1);
    REQUIRE(yl.shape() == Shape{2, 3, 8});
    CHECK(max_abs_diff(yl.narrow(2, 0, 4), a) == 0);
    CHECK(max_abs_diff(yl.narrow(2, 4, 4), a) == 0);
    // int32 ids join too; a single input is copied into a fresh tensor.
    CHECK(cat({from_ids({1, 2}), from_ids({3})}).to_vector<int32_t>() ==
          std::vector<int32_t>{1, 2, 3});
    Tensor single = cat({a});
    CHECK((!single.same(a) && single.storage() != a.storage()));
    CHECK(max_abs_diff(single, a) == 0);
}

TEST_CASE("stack adds a new dim at every position") {
    Tensor a = leaf({2, 3}, 4).detach(), b = leaf({3, 2}, 5).detach().t();
    for (int64_t dim : {0, 1, 2, -1}) {
        CAPTURE(dim);
        Tensor y = stack({a, b}, dim);
        const int64_t d = dim < 0 ? dim + 3 : dim;
        Shape expected = {2, 3};
        expected.insert(expected.begin() + d, 2);
        REQUIRE(y.shape() == expected);
        for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 3; ++j) {
                int64_t ia[3], ib[3];
                int64_t rest[2] = {i, j};
                for (int64_t k = 0, r = 0; k < 3; ++k) ia[k] = ib[k] = k == d ? -1 : rest[r++];
                ia[d] = 0;
                ib[d] = 1;
                CHECK(y.at({ia[0], ia[1], ia[2]}) == a.at({i, j}));
                CHECK(y.at({ib[0], ib[1], ib[2]}) == b.at({i, j}));
            }
    }
    // Scalars stack into a vector.
    CHECK(stack({scalar_tensor(1), scalar_tensor(2)}).to_vector<float>() ==
          std::vector<float>{1, 2});
}

TEST_CASE("split and chunk return views of the right sizes") {
    Tensor x = arange(7 * 3, kF64).view({7, 3});
    auto pieces = split(x, 3);
    CHECK(sizes_along(pieces, 0) == Shape{3, 3, 1});
    for (const Tensor& p : pieces) CHECK(p.storage() == x.storage());  // views: nothing copied
    CHECK(pieces[1].at({0, 0}) == 9);
    CHECK(pieces[2].at({0, 2}) == 20);
    CHECK(sizes_along(split(x, 7), 0) == Shape{7});
    CHECK(sizes_along(split(x, 10), 0) == Shape{7});
    CHECK(sizes_along(split(x, 2, -1), 1) == Shape{2, 1});
    CHECK(sizes_along(split(x.narrow(0, 0, 0), 2), 0) == Shape{0});  // one empty piece
    // torch.chunk's rule: ceil(len / n) per piece, so possibly fewer than n pieces.
    CHECK(sizes_along(chunk(x, 3), 0) == Shape{3, 3, 1});
    CHECK(sizes_along(chunk(x, 7), 0) == Shape{1, 1, 1, 1, 1, 1, 1});
    CHECK(sizes_along(chunk(x, 9), 0) == Shape{1, 1, 1, 1, 1, 1, 1});
    CHECK(sizes_along(chunk(x.narrow(0, 0, 5), 4), 0) == Shape{2, 2, 1});
    CHECK(sizes_along(chunk(x, 3, 1), 1) == Shape{1, 1, 1});
    // Pieces join back into the original.
    CHECK(max_abs_diff(cat(chunk(x, 2, 0), 0), x) == 0);
    CHECK(max_abs_diff(cat(split(x.t(), 2, 1), 1), x.t()) == 0);
}

TEST_CASE("cat and stack gradients, along several dims, non-contiguous inputs") {
    Tensor a = leaf({2, 3, 4}, 6), b = leaf({2, 2, 4}, 7), ct = leaf({4, 3, 2}, 8);
    CHECK_GRADCHECK([&] { return cat({a, b}, 1); }, {a, b});
    CHECK_GRADCHECK([&] { return cat({a, ct.permute({2, 1, 0})}, 0); }, {a, ct});
    CHECK_GRADCHECK(
        [&] {
            return cat({a.narrow(2, 1, 2), ct.permute({2, 1, 0}).narrow(2, 1, 3)}, -1);
        },
        {a, ct});
    // One tensor twice (gradients add) next to a constant (no gradient wanted).
    Tensor k = ones({2, 3, 1}, kF64);
    CHECK_GRADCHECK([&] { return cat({a, k, a}, 2) * 2.0; }, {a});
    Tensor s = leaf({3, 4}, 9), t = leaf({4, 3}, 10);
    for (int64_t dim : {0, 1, 2}) {
        CAPTURE(dim);
        CHECK_GRADCHECK([&] { return stack({s, t.t(), s * s}, dim); }, {s, t});
    }
}

TEST_CASE("split and chunk pieces used downstream get their gradients back") {
    Tensor x = leaf({4, 7}, 11);
    CHECK_GRADCHECK(
        [&] {
            auto p = split(x, 3, 1);  // widths 3, 3, 1
            return cat({p[0] * p[1], tanh(p[2])}, 1);
        },
        {x});
    Tensor qkv = leaf({2, 9}, 12);
    CHECK_GRADCHECK(
        [&] {
            auto p = chunk(qkv.t(), 3, 0);  // three (3, 2) pieces of a transposed input
            return p[0] * p[1] + p[2] * p[2];
        },
        {qkv});
    // Only some pieces used: the unused ones get zero gradient.
    CHECK_GRADCHECK([&] { return exp(chunk(x, 2, 0)[1]); }, {x});
}

TEST_CASE("join bad inputs name the op, the index and the shapes") {
    Tensor a = zeros({2, 3}), b = zeros({2, 3, 1}), c = zeros({4, 4}), d = zeros({2, 3}, kF64);
    CHECK(test::throws_with([&] { cat({}); }, {"cat", "empty list"}));
    CHECK(test::throws_with(
        [&] {
            cat({a, b});
        },
        {"cat", "tensor 1", "[2, 3, 1]", "[2, 3]", "rank"}));
    CHECK(test::throws_with([&] { cat({a, a, c}, 0); }, {"cat", "tensor 2", "[4, 4]", "dim 0"}));
    CHECK(test::throws_with([&] { cat({a, d}); }, {"cat", "tensor 1", "float64", "float32"}));
    CHECK(test::throws_with([&] { cat({a, a}, 2); }, {"cat", "dim 2"}));
    CHECK(test::throws_with([&] { cat({scalar_tensor(1)}); }, {"cat", "scalar"}));
    CHECK(test::throws_with([&] { cat({a, Tensor()}); }, {"cat", "tensor 1", "undefined"}));
    CHECK(test::throws_with([&] { stack({}); }, {"stack", "empty list"}));
    CHECK(test::throws_with([&] { stack({a, c}); }, {"stack", "tensor 1", "[4, 4]", "[2, 3]"}));
    CHECK(test::throws_with([&] { stack({a, a}, 3); }, {"stack", "dim 3"}));
    CHECK(test::throws_with([&] { split(a, 0); }, {"split", "> 0", "got 0", "[2, 3]"}));
    CHECK(test::throws_with([&] { split(a, 1, 2); }, {"split", "dim 2"}));
    CHECK(test::throws_with([&] { chunk(a, -1); }, {"chunk", "> 0", "got -1"}));
    CHECK(test::throws_with([&] { chunk(a, 2, -3); }, {"chunk", "dim -3"}));
}
