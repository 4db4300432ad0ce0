// The `cuda_dropout` suite: dropout on cuda (mask drawn on the cpu, applied by cuda/dropout.cu)
// against the cpu op of ops/dropout.cpp. The same generator state must give the same mask on both
// devices, so the outputs and gradients are compared bitwise (x · s is one rounding on either
// side), float32 and float64, under every run order of the emulator; the generator must advance by
// the same amount; p = 0, p = 1 and eval mode behave as on the cpu. Sizes are ragged (3 x 37 x 45
// = 4995 elements: 20 blocks of 256, the last one partial).
#include "cuda_kernel_check.h"
#include "cuda_parity.h"

using namespace qk;
using qk::test::cuda_runnable;
using qk::test::randn_seeded;

namespace {

// y = dropout(x) and dx for upstream dy, on x's device, with a fresh Generator(seed).
std::pair<Tensor, Tensor> run(const Tensor& x_in, const Tensor& dy, double p, uint64_t seed,
                              Generator* after = nullptr) {
    Tensor x = x_in.detach().clone().requires_grad_();
    Generator gen(seed);
    Tensor y = dropout(x, p, true, gen);
    y.backward(dy.to(x.device()));
    if (after) *after = gen;
    return {y, x.grad()};
}

}  // namespace

TEST_CASE("dropout on cuda draws the cpu's mask: identical values and gradients") {
    if (!cuda_runnable()) return;
    qk::test::RunOrderReset reset;
    for (DType dt : {kF32, kF64})
        for (double p : {0.1, 0.5, 0.9}) {
            CAPTURE(dt);
            CAPTURE(p);
            const Tensor x = randn_seeded({3, 37, 45}, 1, dt),
                         dy = randn_seeded({3, 37, 45}, 2, dt);
            Generator gen_cpu(0), gen_dev(0);
            const auto [y_cpu, dx_cpu] = run(x, dy, p, 77, &gen_cpu);
            for (const std::string& order : qk::test::parity_run_orders()) {
                CAPTURE(order);
                qk::test::set_parity_run_order(order);
                const auto [y, dx] = run(x.to(Device::cuda), dy, p, 77, &gen_dev);
                CHECK(y.device() == Device::cuda);
                CHECK(dx.device() == Device::cuda);
                CHECK(y.to_vector<double>() == y_cpu.to_vector<double>());
                CHECK(dx.to_vector<double>() == dx_cpu.to_vector<double>());
                // Both generators advanced alike: their next draws agree.
                CHECK(gen_dev.next_block() == Generator(gen_cpu).next_block());
            }
        }
}

TEST_CASE("dropout on cuda: a strided input, p = 1, p = 0 and eval mode") {
    if (!cuda_runnable()) return;
    const Tensor x = randn_seeded({37, 45}, 3);
    // A transposed input: the mask follows row-major order of the view on both devices.
    {
        Generator g1(5), g2(5);
        const Tensor want = dropout(x.t(), 0.3, true, g1);
        const Tensor got = dropout(x.to(Device::cuda).t(), 0.3, true, g2);
        CHECK(got.to_vector<float>() == want.to_vector<float>());
    }
    const auto [y1, dx1] = run(x.to(Device::cuda), randn_seeded({37, 45}, 4), 1.0, 9);
    for (double v : y1.to_vector<double>()) REQUIRE(v == 0.0);
    for (double v : dx1.to_vector<double>()) REQUIRE(v == 0.0);
    Generator gen(1);
    const Tensor xd = x.to(Device::cuda);
    CHECK(dropout(xd, 0.0, true, gen).same(xd));  // the identity: x itself, no draw
    CHECK(dropout(xd, 0.5, false, gen).same(xd));
}

TEST_CASE("apply_mask kernel: keep, scale and zero, under every run order") {
    if (!qk::test::cuda_device_or_skip()) return;
    const int64_t n = 1001;  // 4 blocks, the last holding 233 elements
    const auto in = qk::test::random_values<double>(n, 1);
    std::vector<uint8_t> keep(n);
    for (int64_t i = 0; i < n; ++i) keep[i] = (i * 7 + 3) % 5 != 0;
    qk::test::DeviceBuffer<double> d_in(in), d_out(n);
    qk::test::DeviceBuffer<uint8_t> d_keep(keep);
    for (auto order : qk::test::kOrders) {
        CAPTURE(qk::test::order_name(order));
        qk::test::RunOrderScope scope(order);
        cuda::apply_mask(d_out.ptr, d_in.ptr, d_keep.ptr, n, 1.25);
        const auto out = d_out.download();
        for (int64_t i = 0; i < n; ++i) REQUIRE(out[i] == (keep[i] ? in[i] * 1.25 : 0.0));
    }
}
