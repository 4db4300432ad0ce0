// The checks of docs/tour.md's exercises, one TEST_CASE per stop, each the way the library's own
// suites check an op: against an independent reference, with a float64 gradcheck, and on the
// CUDA backend against the cpu. The code exercises (exercises.h) are built twice: with the
// solutions here (answers.cpp, softplus.*: suite `tour`) and with a student's files (`./qk tour`
// copies scaffold/ to tour/ and grades them: suite `tour_yours`).
#include <cmath>
#include <numeric>

#include "../helpers.h"
#ifdef QK_WITH_CUDA
#include "../cuda_parity.h"
#endif
#include "exercises.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"
#include "softplus.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;

namespace {

// Stop 1: a contiguous (2, 3, 4) tensor has strides (12, 4, 1); a view only rearranges them.
TEST_CASE("tour 1: the strides and offset of views") {
    Tensor x = arange(24, kF64).view({2, 3, 4});
    CHECK(x.strides() == Shape{12, 4, 1});
    Tensor t = x.transpose(0, 2);  // (4, 3, 2): the first and last strides swap
    CHECK(t.shape() == Shape{4, 3, 2});
    CHECK(t.strides() == Shape{1, 4, 12});
    CHECK_FALSE(t.is_contiguous());
    Tensor n = x.narrow(1, 1, 2);  // rows 1 and 2 of each (3, 4) matrix: starts 4 elements in
    CHECK(n.shape() == Shape{2, 2, 4});
    CHECK(n.strides() == Shape{12, 4, 1});
    CHECK(n.offset() == 4);
    CHECK(n.at({1, 0, 3}) == 12 + 4 + 3);
    Tensor e = arange(4, kF64).view({1, 4}).expand({3, 4});  // broadcast: stride 0, no copy
    CHECK(e.strides() == Shape{0, 1});
    CHECK(t.storage() == x.storage());               // views share storage
    CHECK(t.contiguous().storage() != x.storage());  // contiguous() had to copy
    CHECK(x.contiguous().same(x));                   // and did not have to here
}

// Stop 2: the gradient of a view goes back into the elements the view covers, and only those.
TEST_CASE("tour 2: a gradient through narrow and transpose lands in the slab") {
    Tensor x = leaf({3, 4}, 1);
    Tensor r = leaf({2, 3}, 2).detach();
    sum(x.narrow(1, 1, 2).t() * r).backward();  // the view is (2, 3): columns 1 and 2, transposed
    Tensor g = x.grad();
    for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j) {
            const double want = (j == 1 || j == 2) ? r.at({j - 1, i}) : 0.0;
            CHECK(g.at({i, j}) == want);
        }
}

// Stop 3: a node written by hand: tour::cube (answers.cpp).
TEST_CASE("tour 3: a hand-written Node passes gradcheck") {
    Tensor x = leaf({3, 5}, 3);
    CHECK(gradcheck([&] { return tour::cube(x); }, {x}).ok);
    CHECK(gradcheck([&] { return tour::cube(x.t()) * x.t(); }, {x}).ok);  // a view, and used twice
    CHECK(max_abs_diff(tour::cube(x), x * x * x) == 0.0);
}

// Stop 4: the accumulation rule. y = x·x + x uses x three times: dy/dx = 2x + 1, added up; a
// second backward adds again.
TEST_CASE("tour 4: gradients add up, within a graph and across backward calls") {
    Tensor x = leaf({4}, 5);
    Tensor y = sum(x * x + x);
    y.backward(/*retain_graph=*/true);
    Tensor once = (x * 2.0 + 1.0).detach();
    CHECK(max_abs_diff(x.grad(), once) < 1e-15);
    y.backward();  // retained: runs again and adds
    CHECK(max_abs_diff(x.grad(), once * 2.0) < 1e-15);
    CHECK(qk::test::throws_with([&] { y.backward(); }, {"backward"}));  // the graph is freed now
    x.zero_grad();
    CHECK_FALSE(x.grad().defined());
}

// Stop 5: tour::softmax_with_wrong_backward (answers.cpp).
TEST_CASE("tour 5: a bug that sum(out) misses and the random probe finds") {
    Tensor x = leaf({3, 6}, 6);
    // With a uniform upstream gradient (what sum(out) sends back) the wrong backward agrees with
    // finite differences: both are zero, as every softmax row sums to 1.
    Tensor y = tour::softmax_with_wrong_backward(x);
    y.backward(ones(y.shape(), kF64));
    CHECK(max_abs_diff(x.grad(), zeros({3, 6}, kF64)) < 1e-15);
    // gradcheck's sum(out · r) with a random r does not.
    CHECK_FALSE(gradcheck([&] { return tour::softmax_with_wrong_backward(x); }, {x}).ok);
    CHECK(gradcheck([&] { return softmax(x); }, {x}).ok);  // the library's is right
}

// Stop 6: softplus, a new pointwise op (tests/tour/softplus.cpp).
TEST_CASE("tour 6: softplus against its composite, in range and far out, and its gradient") {
    Tensor x = leaf({4, 9}, 7, 3.0);
    CHECK(max_abs_diff(tour::softplus(x), log(exp(x) + 1.0)) < 1e-14);
    Tensor far = from_vector({-800, -40, 0, 40, 800}, {5}, kF64);
    const auto y = tour::softplus(far).to_vector<double>();
    CHECK(y[0] == 0.0);  // e^-800 underflows; log(1 + 0) is 0
    CHECK(y[2] == doctest::Approx(std::log(2.0)));
    CHECK(y[4] == 800.0);  // the composite would give inf
    CHECK(std::isinf(log(exp(far) + 1.0).to_vector<double>()[4]));
    CHECK(gradcheck([&] { return tour::softplus(x); }, {x}).ok);
    CHECK(gradcheck([&] { return tour::softplus(x.t() * 0.5); }, {x}).ok);
    CHECK(qk::test::throws_with(
        [] {
            tour::softplus(from_ids({1, 2}, {2}));
        },
        {"softplus", "int32", "[2]"}));
}

// Stop 7: QK-LayerNorm bounds the logits. With unit gains and no bias a LayerNorm row has mean 0
// and variance 1 (up to eps), so its norm is sqrt(D), and by Cauchy–Schwarz
// |N(q)·N(k)| / sqrt(D) <= sqrt(D)·sqrt(D) / sqrt(D) = sqrt(D), however large q and k grow.
TEST_CASE("tour 7: QK-LayerNorm keeps |s| <= sqrt(D) at any scale of q and k") {
    const int64_t D = 16;
    Generator gen(8);
    Tensor w = ones({D}, kF64);
    for (double scale : {1.0, 1e2, 1e4}) {
        Tensor q = normal({5, D}, 0, scale, kF64, gen), k = normal({7, D}, 0, scale, kF64, gen);
        Tensor s_plain = matmul(q, k.t()) / std::sqrt(double(D));
        Tensor s_norm = matmul(layer_norm(q, w, {}, 1e-5), layer_norm(k, w, {}, 1e-5).t()) /
                        std::sqrt(double(D));
        CHECK(max(abs(s_norm)).item() <= std::sqrt(double(D)) + 1e-9);
        if (scale == 1e4) CHECK(max(abs(s_plain)).item() > 1e6);  // grows as scale²
    }
}

// Stop 8: a batched matmul against a 2-D matrix broadcasts it over the batch, so b's gradient
// sums over the batch: db = Σ_i a_iᵀ · dy_i.
TEST_CASE("tour 8: the gradient of a broadcast matmul sums over the batch") {
    Tensor a = leaf({2, 3, 4}, 9), b = leaf({4, 5}, 10);
    Tensor r = leaf({2, 3, 5}, 11).detach();
    sum(matmul(a, b) * r).backward();
    Tensor want = matmul(a.detach().select(0, 0).t(), r.select(0, 0)) +
                  matmul(a.detach().select(0, 1).t(), r.select(0, 1));
    CHECK(max_abs_diff(b.grad(), want) < 1e-13);
    CHECK(gradcheck([&] { return matmul(a, b.t().t()); }, {a, b}).ok);
}

// Stop 9: a counter-based generator: the numbers depend on the seed only.
TEST_CASE("tour 9: the same seed gives the same numbers at any thread count") {
    std::vector<double> draws[2];
    for (int threads : {1, 2}) {
        qk::test::ThreadCount count(threads);
        Generator gen(42);
        draws[threads - 1] = normal({1000}, 0, 1, kF64, gen).to_vector<double>();
    }
    CHECK(draws[0] == draws[1]);
    Generator other(43);
    CHECK(normal({1000}, 0, 1, kF64, other).to_vector<double>() != draws[0]);
}

// Stop 10: a deterministic parallel sum: a fixed split, partials added in task order.
double parallel_sum(const std::vector<double>& v) {
    const int threads = num_threads();
    std::vector<double> partial(threads, 0.0);
    auto task = [&](int t) {
        const size_t begin = v.size() * t / threads, end = v.size() * (t + 1) / threads;
        for (size_t i = begin; i < end; ++i) partial[t] += v[i];
    };
    parallel_run(threads, task);
    return std::accumulate(partial.begin(), partial.end(), 0.0);  // in task order
}

TEST_CASE("tour 10: a parallel sum that replays bit for bit") {
    Generator gen(10);
    const auto v = normal({100003}, 0, 1, kF64, gen).to_vector<double>();
    const double serial = std::accumulate(v.begin(), v.end(), 0.0);
    for (int threads : {1, 2, 3}) {
        qk::test::ThreadCount count(threads);
        const double first = parallel_sum(v);
        for (int run = 0; run < 5; ++run) CHECK(parallel_sum(v) == first);  // same bits
        CHECK(std::abs(first - serial) < 1e-10);  // another split: the last bits may differ
    }
}

// Stop 11: softplus's CUDA twin (tests/tour/softplus.cu) against its cpu kernel, forward and
// gradient, float32 and float64, ragged sizes over several blocks, every emulator run order.
TEST_CASE("tour 11: softplus on cuda matches the cpu") {
#ifndef QK_WITH_CUDA
    MESSAGE("built without CUDA: skipped");
#else
    if (!qk::test::cuda_runnable()) return;
    for (DType dtype : {kF32, kF64}) {
        Generator gen(11);
        qk::test::check_cuda_parity(
            "softplus", [](const qk::test::Inputs& in) { return tour::softplus(in[0]); },
            {normal({3, 517}, 0, 4, dtype, gen)});
    }
#endif
}

// Stop 12: tour::cosine_attention (answers.cpp): bounded by g, and differentiable.
TEST_CASE("tour 12: cosine attention bounds |s| by g and passes gradcheck") {
    Tensor q = leaf({1, 2, 5, 4}, 12), k = leaf({1, 2, 5, 4}, 13), v = leaf({1, 2, 5, 4}, 14);
    Tensor g = full({2}, 3.0, kF64).requires_grad_();
    AttentionSignals signals;
    tour::cosine_attention(q.detach() * 1e6, k.detach() * 1e6, v.detach(), g.detach(), &signals);
    CHECK(max(signals.max_abs_logit).item() <= 3.0 + 1e-12);
}

TEST_CASE("tour 12: cosine attention's gradient, g included") {
    Tensor q = leaf({1, 2, 5, 4}, 12), k = leaf({1, 2, 5, 4}, 13), v = leaf({1, 2, 5, 4}, 14);
    Tensor g = full({2}, 3.0, kF64).requires_grad_();
    CHECK(gradcheck([&] { return tour::cosine_attention(q, k, v, g); }, {q, k, v, g}).ok);
}

// Stop 13: the whole model. A tiny QK-LayerNorm GPT overfits one fixed batch.
TEST_CASE("tour 13: a tiny QK-norm GPT overfits a fixed batch") {
    nn::GPTConfig c;
    c.vocab_size = 11, c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_embd = 16;
    c.qk_norm = nn::QKNorm::layernorm;
    nn::GPT model(c, 13);
    std::vector<int32_t> ids(16), targets(16);
    for (int i = 0; i < 16; ++i) ids[i] = i % 11, targets[i] = (i * 7 + 3) % 11;
    const Tensor x = from_ids(ids, {2, 8}), y = from_ids(targets, {2, 8});
    nn::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0});
    double first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
        nn::GPTOutput out = model.forward(x, y);
        last = out.loss.item();
        if (step == 0) first = last;
        out.loss.backward();
        opt.step(1e-2);
        opt.zero_grad();
    }
    CHECK(first == doctest::Approx(std::log(11.0)).epsilon(0.05));  // uniform at initialisation
    CHECK(last < 0.1 * first);
}

}  // namespace
