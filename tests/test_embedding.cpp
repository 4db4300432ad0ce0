// Embedding: forward against a naive gather, backward against a naive scatter-add (repeated ids,
// both thread counts, bitwise), float64 gradchecks, bad inputs.
#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;
using qk::test::ThreadCount;

namespace {

// dweight[ids[n], c] += dy[n, c], in n order (the kernel's order too, so float results match
// bitwise). dy: (N, C), flat.
std::vector<float> naive_scatter_add(const std::vector<float>& dy, const std::vector<int32_t>& ids,
                                     int64_t V, int64_t C) {
    std::vector<float> dweight(V * C, 0.0f);
    for (size_t n = 0; n < ids.size(); ++n)
        for (int64_t c = 0; c < C; ++c) dweight[ids[n] * C + c] += dy[n * C + c];
    return dweight;
}

// Random ids in [0, V) with many repeats when N > V.
Tensor random_ids(int64_t N, int64_t V, uint64_t seed) {
    Generator gen(seed);
    std::vector<int32_t> ids(N);
    for (auto& id : ids) id = static_cast<int32_t>(gen.uniform() * V);
    return from_ids(ids);
}

}  // namespace

TEST_CASE("embedding forward gathers rows, for any ids shape") {
    Tensor w = leaf({7, 5}, 1).detach();
    Tensor ids = from_ids({3, 0, 3, 6, 1, 3}, {2, 3});
    Tensor y = embedding(w, ids);
    REQUIRE(y.shape() == Shape{2, 3, 5});
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 3; ++j)
            for (int64_t c = 0; c < 5; ++c)
                CHECK(y.at({i, j, c}) == w.at({int64_t(ids.at({i, j})), c}));
    // A transposed (non-contiguous) weight and transposed ids read the same logical rows.
    Tensor wt = leaf({5, 7}, 2).detach().t();
    Tensor idt = ids.t();  // (3, 2)
    Tensor yt = embedding(wt, idt);
    REQUIRE(yt.shape() == Shape{3, 2, 5});
    for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 2; ++j)
            for (int64_t c = 0; c < 5; ++c)
                CHECK(yt.at({i, j, c}) == wt.at({int64_t(idt.at({i, j})), c}));
    // Rank-0 ids give one row of shape (C).
    Tensor one = embedding(w, from_ids({4}).view({}));
    CHECK(one.shape() == Shape{5});
    CHECK(max_abs_diff(one, w.select(0, 4)) == 0);
    // No input requires grad: nothing is recorded.
    CHECK_FALSE(y.requires_grad());
}

TEST_CASE("embedding backward scatter-adds, repeated ids accumulate") {
    const int64_t V = 6, C = 4;
    Generator gen(3);
    Tensor w = randn({V, C}, kF32, gen).requires_grad_();
    const std::vector<int32_t> id_values = {2, 5, 2, 0, 2, 5};  // 2 three times, 1/3/4 never
    Tensor ids = from_ids(id_values, {2, 3});
    Tensor dy = randn({2, 3, C}, kF32, gen);
    embedding(w, ids).backward(dy);
    auto expected = naive_scatter_add(dy.to_vector<float>(), id_values, V, C);
    CHECK(w.grad().to_vector<float>() == expected);
    for (int64_t c = 0; c < C; ++c) {
        CHECK(w.grad().at({1, c}) == 0);  // rows no id selected get exactly zero
        CHECK(w.grad().at({2, c}) ==
              doctest::Approx(dy.at({0, 0, c}) + dy.at({0, 2, c}) + dy.at({1, 1, c})));
    }
}

TEST_CASE("embedding backward is bitwise the same on 1 and 2 threads") {
    // Large enough to cross the kernels' parallel threshold; C not a multiple of a cache line, so
    // the column bands of the two threads have uneven widths.
    const int64_t V = 50, C = 200, N = 1000;
    Tensor ids = random_ids(N, V, 5);
    Generator gen(6);
    Tensor dy = randn({N, C}, kF32, gen);
    auto expected = naive_scatter_add(dy.to_vector<float>(), ids.to_vector<int32_t>(), V, C);
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        ThreadCount scope(threads);
        Tensor w = zeros({V, C}).requires_grad_();
        Tensor y = embedding(w, ids);
        CHECK(max_abs_diff(y, zeros({N, C})) == 0);
        y.backward(dy);
        CHECK(w.grad().to_vector<float>() == expected);
    }
}

TEST_CASE("embedding gradients match finite differences") {
    Tensor w = leaf({6, 3}, 7);
    Tensor ids = from_ids({1, 4, 1, 1, 0, 4}, {3, 2});  // repeats: 1 three times, 4 twice
    CHECK_GRADCHECK([&] { return embedding(w, ids); }, {w});
    CHECK_GRADCHECK([&] { return embedding(w, ids.t()); }, {w});
    // A transposed weight (gradient must come back in w's own layout) used downstream.
    Tensor wt = leaf({3, 6}, 8);
    CHECK_GRADCHECK([&] { return tanh(embedding(wt.t(), ids)); }, {wt});
    // The same table looked up twice in one graph: both lookups' gradients add up.
    Tensor ids2 = from_ids({5, 1, 2, 1});
    CHECK_GRADCHECK(
        [&] { return embedding(w, ids2) * embedding(w, ids.flatten().narrow(0, 0, 4)); }, {w});
}

TEST_CASE("embedding bad inputs name the op, the shapes and the offending id") {
    Tensor w = zeros({7, 5});
    CHECK(test::throws_with(
        [&] { embedding(w, zeros({3})); },
        {"embedding", "ids must be int32", "got float32 of shape [3]", "[0, 7)", "[7, 5]"}));
    CHECK(test::throws_with([&] { embedding(zeros({35}), from_ids({1})); },
                            {"embedding", "2-D", "[35]"}));
    CHECK(test::throws_with(
        [&] {
            embedding(from_ids({1, 2}, {1, 2}), from_ids({1}));
        },
        {"embedding", "float32 or float64", "int32"}));
    Tensor bad = from_ids({0, 1, 2, 3, 4, 9}, {2, 3});
    CHECK(test::throws_with([&] { embedding(w, bad); },
                            {"embedding", "ids[1, 2] = 9", "[7, 5]", "0 <= id < 7"}));
    CHECK(test::throws_with([&] { embedding(w, from_ids({-1})); }, {"ids[0] = -1"}));
}
