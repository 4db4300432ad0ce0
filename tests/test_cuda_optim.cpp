// The `cuda_optim` suite: AdamW's fused update on cuda (cuda/adamw.cu) against the cpu loop of
// nn/optim/optim.cpp, and SGD and Muon (tensor ops, so they run wherever their parameters live),
// float32 and float64, under every run order of the emulator. The same parameters and the same
// sequence of gradients are fed to a cpu and a cuda optimiser for several steps: the weights and
// moments must agree within the dtype's tolerance (not bitwise: nvcc contracts to fma where g++
// does not). Parameter sizes are ragged (37, 3 x 45, 1) and the largest spans several 256-thread
// blocks. The multi-tensor passes (cuda/multi_tensor.cu: AdamW, the sum of squares and scaling
// behind clip_grad_norm) are checked against the one-tensor kernel bit for bit and against the cpu.
#include <memory>
#include <utility>

#include "cuda_kernel_check.h"
#include "cuda_parity.h"
#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/optim/muon.h"
#include "nn/optim/optim.h"
#include "nn_variants.h"
#include "ops/matmul.h"

using namespace qk;
using qk::test::cuda_runnable;
using qk::test::parity_mismatch;
using qk::test::randn_seeded;

namespace {

// The parameters of one run: a bias-like vector (no decay), a matrix (decayed), a scalar.
std::vector<Tensor> make_params(DType dt, Device device) {
    std::vector<Tensor> ps = {randn_seeded({37}, 1, dt), randn_seeded({3, 45}, 2, dt),
                              randn_seeded({1}, 3, dt)};
    for (Tensor& p : ps) {
        p = p.to(device);
        p.requires_grad_();
    }
    return ps;
}

// Gradient `step` of parameter i, the same on both devices: drawn on the cpu from a fixed seed,
// with a wide spread of magnitudes so that sqrt(v̂) + ε is tested near ε too.
Tensor gradient(const Tensor& p, int step, size_t i) {
    const double scale = (step % 3 == 0) ? 1e-4 : 1.0;
    return randn_seeded(p.shape(), 100 + 10 * uint64_t(step) + i, p.dtype(), scale);
}

void check_close(const Tensor& got, const Tensor& want, const std::string& what) {
    CAPTURE(what);
    const bool f64 = want.dtype() == kF64;
    // Several steps of the same arithmetic, with and without fma: a few ulps of drift per step.
    const std::string m =
        parity_mismatch(got.to(Device::cpu), want, f64 ? 1e-13 : 2e-6, f64 ? 1e-12 : 2e-5);
    CHECK_MESSAGE(m.empty(), m);
}

}  // namespace

TEST_CASE("AdamW on cuda parameters matches the cpu over several steps, both decay variants") {
    if (!cuda_runnable()) return;
    qk::test::RunOrderReset reset;
    for (DType dt : {kF32, kF64})
        for (bool independent : {false, true})
            for (const std::string& order : qk::test::parity_run_orders()) {
                CAPTURE(dt);
                CAPTURE(independent);
                CAPTURE(order);
                qk::test::set_parity_run_order(order);
                const nn::AdamWOptions options{.lr = 3e-2,
                                               .weight_decay = 0.1,
                                               .independent_weight_decay = independent,
                                               .lr_max = 6e-2};
                std::vector<Tensor> p_cpu = make_params(dt, Device::cpu);
                std::vector<Tensor> p_dev = make_params(dt, Device::cuda);
                nn::AdamW opt_cpu(p_cpu, options), opt_dev(p_dev, options);
                for (int step = 0; step < 6; ++step) {
                    for (size_t i = 0; i < p_cpu.size(); ++i) {
                        if (step == 2 && i == 2) continue;  // a parameter without a gradient
                        const Tensor g = gradient(p_cpu[i], step, i);
                        p_cpu[i].set_grad(g);
                        p_dev[i].set_grad(g.to(Device::cuda));
                    }
                    const double lr = 3e-2 * (1 + step) / 6;  // a warmup: lr changes every step
                    opt_cpu.step(lr);
                    opt_dev.step(lr);
                    opt_cpu.zero_grad();
                    opt_dev.zero_grad();
                }
                CHECK(opt_dev.steps() == 6);
                const auto s_cpu = opt_cpu.state(), s_dev = opt_dev.state();
                for (size_t i = 0; i < p_cpu.size(); ++i) {
                    CHECK(p_dev[i].device() == Device::cuda);
                    check_close(p_dev[i].detach(), p_cpu[i].detach(), fmt::format("p{}", i));
                    CHECK(s_dev[2 * i].device() == Device::cuda);
                    check_close(s_dev[2 * i], s_cpu[2 * i], fmt::format("m{}", i));
                    check_close(s_dev[2 * i + 1], s_cpu[2 * i + 1], fmt::format("v{}", i));
                }
            }
}

TEST_CASE("AdamW kernel: one step against the formula, large enough for several blocks") {
    if (!qk::test::cuda_device_or_skip()) return;
    const int64_t n = 1000;  // 4 blocks of 256, the last one ragged
    const auto p0 = qk::test::random_values<double>(n, 1),
               g = qk::test::random_values<double>(n, 2);
    auto m0 = qk::test::random_values<double>(n, 3, 0.1),
         v0 = qk::test::random_values<double>(n, 4);
    for (auto& x : v0) x = x * x;  // a second moment is non-negative
    const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, decay = 0.1;
    const double bias1 = 1 - b1 * b1 * b1, bias2 = 1 - b2 * b2 * b2;  // step 3
    qk::test::DeviceBuffer<double> d_p(p0), d_g(g), d_m(m0), d_v(v0);
    cuda::adamw_update(d_p.ptr, d_g.ptr, d_m.ptr, d_v.ptr, n, lr, b1, b2, eps, decay, bias1, bias2);
    const auto p = d_p.download(), m = d_m.download(), v = d_v.download();
    for (int64_t i = 0; i < n; ++i) {
        const double mi = b1 * m0[i] + (1 - b1) * g[i], vi = b2 * v0[i] + (1 - b2) * g[i] * g[i];
        const double pi = p0[i] - lr * (mi / bias1 / (std::sqrt(vi / bias2) + eps) + decay * p0[i]);
        REQUIRE(m[i] == doctest::Approx(mi).epsilon(1e-14));
        REQUIRE(v[i] == doctest::Approx(vi).epsilon(1e-14));
        REQUIRE(p[i] == doctest::Approx(pi).epsilon(1e-13));
    }
}

TEST_CASE("SGD with momentum and weight decay on cuda parameters matches the cpu") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        std::vector<Tensor> p_cpu = make_params(dt, Device::cpu);
        std::vector<Tensor> p_dev = make_params(dt, Device::cuda);
        nn::SGD opt_cpu(p_cpu, 0.9, 0.01), opt_dev(p_dev, 0.9, 0.01);
        for (int step = 0; step < 4; ++step) {
            for (size_t i = 0; i < p_cpu.size(); ++i) {
                const Tensor g = gradient(p_cpu[i], step, i);
                p_cpu[i].set_grad(g);
                p_dev[i].set_grad(g.to(Device::cuda));
            }
            opt_cpu.step(0.05);
            opt_dev.step(0.05);
        }
        for (size_t i = 0; i < p_cpu.size(); ++i) {
            CHECK(p_dev[i].device() == Device::cuda);
            check_close(p_dev[i].detach(), p_cpu[i].detach(), fmt::format("p{}", i));
        }
    }
}

TEST_CASE("Muon on cuda parameters matches the cpu: Newton-Schulz on cuBLAS, row blocks") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        auto params = [&](Device device) {  // a (45, 37) matrix and a (3·12, 12) like c_attn
            Tensor a = randn_seeded({45, 37}, 4, dt).to(device).requires_grad_();
            Tensor b = randn_seeded({36, 12}, 5, dt).to(device).requires_grad_();
            return std::vector<Tensor>{a, b};
        };
        auto matrices = [](const std::vector<Tensor>& p) {
            return std::vector<nn::MuonMatrix>{
                {p[0], 0, -1, "a"}, {p[1], 0, 12, "q"}, {p[1], 12, 12, "k"}, {p[1], 24, 12, "v"}};
        };
        std::vector<Tensor> p_cpu = params(Device::cpu), p_dev = params(Device::cuda);
        nn::Muon opt_cpu(matrices(p_cpu), {}), opt_dev(matrices(p_dev), {});
        for (int step = 0; step < 3; ++step) {
            for (size_t i = 0; i < p_cpu.size(); ++i) {
                const Tensor g = gradient(p_cpu[i], step, i);
                p_cpu[i].set_grad(g);
                p_dev[i].set_grad(g.to(Device::cuda));
            }
            opt_cpu.step(0.02);
            opt_dev.step(0.02);
        }
        for (size_t i = 0; i < p_cpu.size(); ++i) {
            CHECK(p_dev[i].device() == Device::cuda);
            check_close(p_dev[i].detach(), p_cpu[i].detach(), fmt::format("p{}", i));
        }
    }
}

// ---- the multi-tensor passes (cuda/multi_tensor.cu) -------------------------------------------

namespace {

// Ragged tensor sizes: a scalar, a tensor inside one block, one that spans two 32k-element chunks
// with a ragged tail, and one of 255 (not a multiple of 32).
const std::vector<int64_t> kMultiSizes = {1, 37, 32768 + 45, 255};

template <class T>
std::vector<std::vector<T>> multi_values(uint64_t seed, double scale = 1.0) {
    std::vector<std::vector<T>> values;
    for (size_t k = 0; k < kMultiSizes.size(); ++k)
        values.push_back(qk::test::random_values<T>(kMultiSizes[k], seed + k, scale));
    return values;
}

}  // namespace

TEST_CASE("multi-tensor AdamW equals the one-tensor kernel bit for bit, chunks crossing tensors") {
    if (!qk::test::cuda_device_or_skip()) return;
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, bias1 = 0.271f, bias2 = 0.142625f;
    const auto p0 = multi_values<float>(10), g = multi_values<float>(20),
               m0 = multi_values<float>(30, 0.1);
    auto v0 = multi_values<float>(40);
    for (auto& v : v0)
        for (float& x : v) x *= x;
    std::vector<std::unique_ptr<qk::test::DeviceBuffer<float>>> one, all;  // p, g, m, v per tensor
    std::vector<nn::AdamWSlot<float>> slots;
    for (size_t k = 0; k < kMultiSizes.size(); ++k) {
        for (auto* list : {&one, &all})
            for (const std::vector<float>* host : {&p0[k], &g[k], &m0[k], &std::as_const(v0)[k]})
                list->push_back(std::make_unique<qk::test::DeviceBuffer<float>>(*host));
        const float decay = k % 2 ? 0.1f : 0.0f;
        cuda::adamw_update(one[4 * k]->ptr, one[4 * k + 1]->ptr, one[4 * k + 2]->ptr,
                           one[4 * k + 3]->ptr, kMultiSizes[k], lr, b1, b2, eps, decay, bias1,
                           bias2);
        slots.push_back({all[4 * k]->ptr, all[4 * k + 1]->ptr, all[4 * k + 2]->ptr,
                         all[4 * k + 3]->ptr, kMultiSizes[k], decay});
    }
    cuda::adamw_update_all(slots, lr, b1, b2, eps, bias1, bias2);
    for (size_t i = 0; i < one.size(); ++i) {
        CAPTURE(i);
        CHECK(one[i]->download() == all[i]->download());
    }
}

TEST_CASE("multi-tensor sum of squares and scale match the cpu, the same bits in every run order") {
    if (!cuda_runnable()) return;
    qk::test::RunOrderReset reset;
    const auto f32 = multi_values<float>(50);
    const auto f64_values = multi_values<double>(60);
    double want32 = 0, want64 = 0;
    for (size_t k = 0; k < kMultiSizes.size(); ++k)
        for (int64_t i = 0; i < kMultiSizes[k]; ++i) {
            want32 += double(f32[k][i]) * double(f32[k][i]);
            want64 += f64_values[k][i] * f64_values[k][i];
        }
    std::vector<double> got32;
    for (const std::string& order : qk::test::parity_run_orders()) {
        CAPTURE(order);
        qk::test::set_parity_run_order(order);
        std::vector<std::unique_ptr<qk::test::DeviceBuffer<float>>> d32;
        std::vector<std::unique_ptr<qk::test::DeviceBuffer<double>>> d64;
        std::vector<const float*> p32;
        std::vector<const double*> p64;
        for (size_t k = 0; k < kMultiSizes.size(); ++k) {
            d32.push_back(std::make_unique<qk::test::DeviceBuffer<float>>(f32[k]));
            d64.push_back(std::make_unique<qk::test::DeviceBuffer<double>>(f64_values[k]));
            p32.push_back(d32.back()->ptr);
            p64.push_back(d64.back()->ptr);
        }
        got32.push_back(cuda::sum_of_squares(p32, kMultiSizes));
        // Float squares summed in float within a chunk (128 per thread, then a tree): a few ulps.
        CHECK(got32.back() == doctest::Approx(want32).epsilon(1e-6));
        CHECK(cuda::sum_of_squares(p64, kMultiSizes) == doctest::Approx(want64).epsilon(1e-14));
        CHECK(got32.back() == got32.front());  // a fixed tree: no run order changes a bit
        std::vector<float*> scaled = {d32[1]->ptr, d32[2]->ptr};
        cuda::scale_all(scaled, {kMultiSizes[1], kMultiSizes[2]}, 0.5f);
        for (size_t k : {1, 2}) {
            const auto after = d32[k]->download();
            for (int64_t i = 0; i < kMultiSizes[k]; ++i) REQUIRE(after[i] == f32[k][i] * 0.5f);
        }
        CHECK(d32[0]->download() == f32[0]);  // not in the list: untouched
    }
}

TEST_CASE("clip_grad_norm on cuda gradients matches the cpu: the norm, the clip, the loss scale") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        std::vector<Tensor> p_cpu = make_params(dt, Device::cpu),
                            p_dev = make_params(dt, Device::cuda);
        for (size_t i = 0; i < p_cpu.size(); ++i) {
            const Tensor g = gradient(p_cpu[i], 1, i);
            p_cpu[i].set_grad(g);
            p_dev[i].set_grad(g.to(Device::cuda));
        }
        // A strided gradient takes the tensor-op path on both devices.
        p_cpu[1].set_grad(gradient(p_cpu[1], 2, 1).t().contiguous().t());
        p_dev[1].set_grad(p_cpu[1].grad().to(Device::cuda));
        const double norm_cpu = nn::clip_grad_norm(p_cpu, 1.0, true, 4.0);
        const double norm_dev = nn::clip_grad_norm(p_dev, 1.0, true, 4.0);
        CHECK(norm_dev == doctest::Approx(norm_cpu).epsilon(dt == kF64 ? 1e-14 : 1e-6));
        for (size_t i = 0; i < p_cpu.size(); ++i)
            check_close(p_dev[i].grad(), p_cpu[i].grad(), fmt::format("clipped g{}", i));
    }
}

namespace {

// Three AdamW steps of a tiny half-precision GPT on `device`: the losses, then the weights.
// `round_every_call` marks every parameter written before each forward, so that each GEMM
// rounds its weight afresh, as before weights were cast once.
std::vector<double> half_training(Device device, Precision precision, bool round_every_call) {
    nn::GPTConfig config = test::tiny_config();
    config.precision = precision;
    nn::GPT model(config, 4);
    model.to(device);
    nn::AdamW opt(model.parameters(), {.lr = 3e-2});
    std::vector<int32_t> ids(2 * config.block_size);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 3 % config.vocab_size);
    const Tensor x = from_ids(ids, {2, config.block_size}).to(device);
    std::vector<double> out;
    for (int step = 0; step < 3; ++step) {
        if (round_every_call)
            for (const Tensor& p : model.parameters()) mark_written(p);
        const Tensor loss = model.forward(x, x).loss;
        loss.backward();
        opt.step(3e-2);
        opt.zero_grad();
        out.push_back(loss.item());
    }
    for (const Tensor& p : model.parameters())
        for (float v : p.to(Device::cpu).to_vector<float>()) out.push_back(v);
    return out;
}

}  // namespace

TEST_CASE("weights cast once: the optimizer's copy trains bit for bit as rounding every call") {
    std::vector<Device> devices = {Device::cpu};
    if (cuda_runnable()) devices.push_back(Device::cuda);
    for (Device device : devices)
        for (Precision precision : {Precision::bf16, Precision::fp16}) {
            CAPTURE(device);
            CAPTURE(precision);
            const auto once = half_training(device, precision, false);
            const auto every_call = half_training(device, precision, true);
            REQUIRE(once.size() == every_call.size());
            size_t differ = 0;
            for (size_t i = 0; i < once.size(); ++i) differ += once[i] != every_call[i];
            CHECK(differ == 0);
            CHECK(once[2] < once[0]);  // it trains
        }
}

TEST_CASE("weights cast once: AdamW rewrites the copy, and a stale backward is refused") {
    std::vector<Device> devices = {Device::cpu};
    if (cuda_runnable()) devices.push_back(Device::cuda);
    for (Device device : devices) {
        CAPTURE(device);
        Tensor w = randn_seeded({4, 3}, 5, kF32).to(device);
        w.requires_grad_();
        Tensor x = randn_seeded({2, 3}, 6, kF32).to(device);
        x.requires_grad_();  // dx reads the rounded weight
        nn::AdamW opt({w}, {.lr = 0.1});
        const Tensor y = linear(x, w, Tensor(), Precision::bf16);
        const std::shared_ptr<Storage> copy = w.storage()->cast_copy().storage;
        REQUIRE(copy);
        sum(y * y).backward();
        opt.step(0.1);
        // The same buffer, rewritten in the update's pass with the new weights' rounding.
        CHECK(w.storage()->cast_copy().storage == copy);
        CHECK(w.storage()->cast_copy().version == w.storage()->version());
        const auto got = cast_once(w, kBF16).to(Device::cpu).to_vector<bf16>();
        const auto want = w.to(kBF16).to(Device::cpu).to_vector<bf16>();
        for (size_t i = 0; i < want.size(); ++i) CHECK(got[i].bits == want[i].bits);
        // A forward, an optimizer step, then that forward's backward: its weights are gone.
        const Tensor z = linear(x, w, Tensor(), Precision::bf16);
        opt.step(0.1);
        CHECK(test::throws_with([&] { sum(z * z).backward(); },
                                {"linear", "backward after the weight [4, 3] was written"}));
    }
}

TEST_CASE("weights cast once: Muon rewrites the copy of every block, one launch a pass on cuda") {
    std::vector<Device> devices = {Device::cpu};
    if (cuda_runnable()) devices.push_back(Device::cuda);
    for (Device device : devices) {
        CAPTURE(device);
        // Like c_attn: q, k and v, three 4 × 4 blocks of one (12, 4) weight, one shape group.
        Tensor w = randn_seeded({12, 4}, 7, kF32).to(device);
        w.requires_grad_();
        const Tensor x = randn_seeded({3, 4}, 8, kF32).to(device);
        nn::Muon opt({{w, 0, 4, "q"}, {w, 4, 4, "k"}, {w, 8, 4, "v"}}, {});
        const Tensor y = linear(x, w, Tensor(), Precision::bf16);  // makes the bf16 copy
        const std::shared_ptr<Storage> copy = w.storage()->cast_copy().storage;
        REQUIRE(copy);
        sum(y * y).backward();
        const bool count = device == Device::cuda;
        size_t iteration_launches = 0;  // the batched Newton–Schulz alone, on a batch like U
        if (count) {
            const Tensor batch = randn_seeded({3, 4, 4}, 9, kF32).to(device);
            cuda::ledger::open();
            nn::newton_schulz5(batch);
            iteration_launches = cuda::ledger::close().size();
            cuda::ledger::open();
        }
        opt.step(0.02);
        if (count) {
            const std::vector<cuda::ledger::Entry> launches = cuda::ledger::close();
            int momentum = 0, weight = 0;
            for (const cuda::ledger::Entry& e : launches) {
                momentum += e.name.find("muon_momentum_all_kernel") != std::string::npos;
                weight += e.name.find("muon_weight_all_kernel") != std::string::npos;
            }
            CHECK(momentum == 1);  // the three blocks in one launch (tensor ops: five a block)
            CHECK(weight == 1);    // their update and the copy (tensor ops: four a block)
            CHECK(launches.size() == iteration_launches + 2);  // and nothing else
        }
        // The same buffer, rewritten in the update's pass: every block's rows, current again.
        CHECK(w.storage()->cast_copy().storage == copy);
        CHECK(w.storage()->cast_copy().version == w.storage()->version());
        const auto got = cast_once(w, kBF16).to(Device::cpu).to_vector<bf16>();
        const auto want = w.to(kBF16).to(Device::cpu).to_vector<bf16>();
        for (size_t i = 0; i < want.size(); ++i) CHECK(got[i].bits == want[i].bits);
    }
}
