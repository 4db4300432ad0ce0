// The `cuda_embedding` suite: cuda/embedding.cu against the cpu op of ops/embedding.cpp — the
// gather forward and the atomicAdd scatter backward, float32 and float64, under every run order of
// the emulator. Repeated ids sum their dy rows in an order the scheduling picks, so those
// gradients are compared within a tolerance; with distinct ids every dweight element is a single
// add onto zero and must be bit-identical to the cpu under every order. Sizes are ragged (C = 37,
// 45, 100) and span several 256-thread blocks; N · C stays under 16k threads.
#include <numeric>

#include "cuda_kernel_check.h"
#include "cuda_parity.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::cuda_runnable;
using qk::test::Inputs;
using qk::test::randn_seeded;
using qk::test::throws_with;

namespace {

// n ids in [0, V), drawn with a fixed seed: with n > V some repeat.
Tensor random_ids(int64_t n, int64_t V, uint64_t seed, Shape shape) {
    Generator gen(seed);
    std::vector<uint32_t> words(static_cast<size_t>(n));
    gen.fill(words.data(), n);
    std::vector<int32_t> ids;
    for (uint32_t w : words) ids.push_back(static_cast<int32_t>(w % static_cast<uint32_t>(V)));
    return from_ids(ids, std::move(shape));
}

// n distinct ids in [0, V) (n <= V), in a scrambled order.
Tensor distinct_ids(int64_t n, int64_t V, Shape shape) {
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    for (size_t i = 0; i < ids.size(); ++i) std::swap(ids[i], ids[(i * 7919 + 13) % ids.size()]);
    ids.resize(static_cast<size_t>(n));
    return from_ids(ids, std::move(shape));
}

Tensor embed(const Inputs& in) { return embedding(in[0], in[1]); }

}  // namespace

TEST_CASE("embedding on cuda matches the cpu, values and dweight, with repeated ids") {
    struct Case {
        int64_t V, C;
        Shape ids_shape;
    };
    // (2, 45) ids into 50 rows: many repeats; (3, 7) into 10 rows of 100: heavy repeats, C > 32;
    // (2, 3, 11) into 1000: mostly distinct, a rank-3 ids tensor.
    const Case cases[] = {{50, 37, {2, 45}}, {10, 100, {3, 7}}, {1000, 45, {2, 3, 11}}};
    for (DType dt : {kF32, kF64})
        for (const Case& c : cases) {
            CAPTURE(dt);
            CAPTURE(c.ids_shape);
            const Tensor w = randn_seeded({c.V, c.C}, 11 + c.V, dt);
            const Tensor ids = random_ids(numel_of(c.ids_shape), c.V, 5 + c.C, c.ids_shape);
            check_cuda_parity("embedding", embed, {w, ids});
        }
}

TEST_CASE("embedding on cuda with distinct ids is bit-identical to the cpu in every run order") {
    if (!cuda_runnable()) return;
    qk::test::RunOrderReset reset;
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        const int64_t V = 300, C = 37;
        const Tensor ids = distinct_ids(2 * 101, V, {2, 101});  // 7474 threads, 30 blocks
        const Tensor w_cpu = randn_seeded({V, C}, 3, dt).requires_grad_();
        const Tensor dy = randn_seeded({2, 101, C}, 4, dt);
        Tensor y_cpu = embedding(w_cpu, ids);
        y_cpu.backward(dy);
        for (const std::string& order : qk::test::parity_run_orders()) {
            CAPTURE(order);
            qk::test::set_parity_run_order(order);
            Tensor w = w_cpu.detach().to(Device::cuda).requires_grad_();
            Tensor y = embedding(w, ids.to(Device::cuda));
            y.backward(dy.to(Device::cuda));
            CHECK(y.to_vector<double>() == y_cpu.to_vector<double>());  // a gather: exact
            CHECK(w.grad().to_vector<double>() == w_cpu.grad().to_vector<double>());
        }
    }
}

TEST_CASE("embedding kernels: gather is exact, scatter-add of one hot row sums every position") {
    if (!qk::test::cuda_device_or_skip()) return;
    // Every position names row 2 of a (5, 33) table: the worst contention for the atomics. The
    // sum of 300 ones is exact in any order, so the result is exact too.
    const int64_t V = 5, C = 33, N = 300;
    const std::vector<int32_t> ids(N, 2);
    const std::vector<float> dy(N * C, 1.0f);
    const auto weight = qk::test::random_values<float>(V * C, 9);
    qk::test::DeviceBuffer<int32_t> d_ids(ids);
    qk::test::DeviceBuffer<float> d_dy(dy), d_w(weight), d_dw(V * C), d_y(N * C);
    for (auto order : qk::test::kOrders) {
        CAPTURE(qk::test::order_name(order));
        qk::test::RunOrderScope scope(order);
        cuda::fill_zero(d_dw.ptr, V * C * sizeof(float));
        cuda::embedding_backward(d_dw.ptr, d_dy.ptr, d_ids.ptr, N, C);
        const auto dw = d_dw.download();
        for (int64_t v = 0; v < V; ++v)
            for (int64_t c = 0; c < C; ++c) REQUIRE(dw[v * C + c] == (v == 2 ? float(N) : 0.0f));
        cuda::embedding_forward(d_y.ptr, d_w.ptr, d_ids.ptr, N, C);
        const auto y = d_y.download();
        for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) REQUIRE(y[n * C + c] == weight[2 * C + c]);
    }
}

TEST_CASE("embedding on cuda accepts cpu ids, and checks ids on the host") {
    if (!cuda_runnable()) return;
    const Tensor w_cpu = randn_seeded({6, 40}, 1);
    const Tensor w = w_cpu.to(Device::cuda);
    const Tensor ids = from_ids({0, 5, 5, 2, 1, 3, 4}, {7});
    // cpu ids with a cuda weight: the batch stays where the data loader made it.
    const Tensor y = embedding(w, ids);
    CHECK(y.device() == Device::cuda);
    CHECK(y.to_vector<float>() == embedding(w_cpu, ids).to_vector<float>());
    // Out of range, on either device of the ids: the same message as on the cpu.
    for (Device d : {Device::cpu, Device::cuda}) {
        CAPTURE(std::string(device_name(d)));
        CHECK(throws_with(
            [&] {
                embedding(w, from_ids({0, 6, 1}, {3}).to(d));
            },
            {"embedding", "ids[1] = 6", "[6, 40]"}));
        CHECK(throws_with(
            [&] {
                embedding(w, from_ids({0, 1, 2, -1}, {2, 2}).to(d));
            },
            {"ids[1, 1] = -1"}));
    }
    // cuda ids with a cpu weight: the weight should move, not the ids.
    CHECK(throws_with([&] { embedding(w_cpu, ids.to(Device::cuda)); },
                      {"embedding", "weight [6, 40] is on cpu", "ids [7] are on cuda",
                       "weight's device or on the cpu"}));
}
