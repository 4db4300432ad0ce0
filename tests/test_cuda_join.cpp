// The `cuda_join` suite: cat and stack on cuda (cuda/join.cu) and split / chunk (narrow views, no
// kernel of their own) against the cpu ops of ops/join.cpp, values and gradients, float32 and
// float64 (int32 values for cat), under every run order of the emulator. Sizes are ragged (37,
// 45, 7), joined along the first, a middle and the last dim, with non-contiguous inputs too, so
// that the outer/inner decomposition and the contiguous() before the kernel are both exercised;
// the largest inputs span several 256-thread blocks.
#include "cuda_kernel_check.h"
#include "cuda_parity.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::cuda_runnable;
using qk::test::Inputs;
using qk::test::randn_seeded;
using qk::test::throws_with;

TEST_CASE("cat on cuda matches the cpu along every dim, values and gradients") {
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        // Along dim 0, 1 and 2 of (., 37, 45)-like shapes: outer = 1, 3, 111; inner = 1665, 45, 1.
        const Tensor a = randn_seeded({3, 37, 45}, 1, dt), b = randn_seeded({2, 37, 45}, 2, dt);
        check_cuda_parity("cat dim 0",
                          [](const Inputs& in) {
                              return cat({in[0], in[1]}, 0);
                          },
                          {a.narrow(0, 0, 1), b});
        const Tensor c = randn_seeded({3, 7, 45}, 3, dt), d = randn_seeded({3, 30, 45}, 4, dt);
        check_cuda_parity("cat dim 1, three inputs",
                          [](const Inputs& in) {
                              return cat({in[0], in[1], in[0]}, 1);
                          },
                          {c, d});
        const Tensor e = randn_seeded({3, 37, 5}, 5, dt), f = randn_seeded({3, 37, 40}, 6, dt);
        check_cuda_parity("cat dim -1",
                          [](const Inputs& in) {
                              return cat({in[0], in[1]}, -1);
                          },
                          {e, f});
        // A transposed (non-contiguous) input and an empty one.
        check_cuda_parity("cat of a transpose and an empty piece",
                          [](const Inputs& in) {
                              return cat({in[0].t(), in[1], in[0].t().narrow(1, 0, 0)}, 1);
                          },
                          {randn_seeded({45, 37}, 7, dt), randn_seeded({37, 9}, 8, dt)});
    }
}

TEST_CASE("stack, split and chunk on cuda match the cpu, values and gradients") {
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        const Tensor a = randn_seeded({5, 37}, 1, dt), b = randn_seeded({5, 37}, 2, dt);
        check_cuda_parity("stack dim 1",
                          [](const Inputs& in) {
                              return stack({in[0], in[1]}, 1);
                          },
                          {a, b});
        // Pieces used downstream in a different order: each gradient lands in its own place.
        check_cuda_parity("split then cat reversed",
                          [](const Inputs& in) {
                              auto p = split(in[0], 16, 1);  // 16, 16, 13
                              return cat({p[2], p[0] * 2.0, p[1]}, 1);
                          },
                          {randn_seeded({7, 45}, 3, dt)});
        check_cuda_parity("chunk, one piece unused",
                          [](const Inputs& in) {
                              auto p = chunk(in[0], 3, 0);  // 13, 13, 11 rows
                              return p[0] + p[1].narrow(0, 0, 13) * p[0];
                          },
                          {randn_seeded({37, 9}, 4, dt)});
    }
}

TEST_CASE("cat of int32 tensors on cuda, and its errors") {
    if (!cuda_runnable()) return;
    const Tensor x = from_ids({1, 2, 3, 4, 5, 6}, {2, 3}), y = from_ids({7, 8}, {2, 1});
    const Tensor got = cat({x.to(Device::cuda), y.to(Device::cuda)}, 1);
    CHECK(got.device() == Device::cuda);
    CHECK(got.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 7, 4, 5, 6, 8});
    CHECK(throws_with(
        [&] {
            cat({x.to(Device::cuda), y}, 1);
        },
        {"cat", "tensor 1 is on cpu", "tensor 0 is on cuda"}));
}

TEST_CASE("cat_copy kernel: one band of a wider row, under every run order") {
    if (!qk::test::cuda_device_or_skip()) return;
    const int64_t outer = 37, x_row = 45, y_row = 100, col = 31;  // 1665 threads, 7 blocks
    const auto x = qk::test::random_values<float>(outer * x_row, 1);
    const std::vector<float> sentinel(outer * y_row, -7.0f);
    for (auto order : qk::test::kOrders) {
        CAPTURE(qk::test::order_name(order));
        qk::test::RunOrderScope scope(order);
        qk::test::DeviceBuffer<float> d_x(x), d_y(sentinel);
        cuda::cat_copy(d_y.ptr, y_row, d_x.ptr, x_row, col, outer);
        const auto y = d_y.download();
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t j = 0; j < y_row; ++j) {
                const bool inside = j >= col && j < col + x_row;
                REQUIRE(y[o * y_row + j] == (inside ? x[o * x_row + j - col] : -7.0f));
            }
    }
}
