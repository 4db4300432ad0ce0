// The CUDA parity harness: run one function of tensors on the cpu and on the device, and compare
// the outputs and the gradients of every input.
//
//   check_cuda_parity("gelu", [](const Inputs& in) { return gelu(in[0]); }, {randn({3, 37})});
//
// The inputs are given on the cpu. Each floating-point input becomes a leaf that requires grad on
// each device (pass requires_grad to choose; int32 inputs such as token ids never do). The
// scalar differentiated is sum(f(x) * r) with a fixed random probe r, not sum(f(x)), so terms that
// vanish under a uniform upstream gradient are compared too (as in gradcheck). The device run
// must give a cuda output and cuda gradients, equal to the cpu's within the tolerance of the
// dtype: |cuda − cpu| <= atol + rtol·|cpu| elementwise (NaN and ±inf must match exactly).
//
// In the emulation build the device run is repeated under the three run orders (forward,
// reverse, random with a fixed seed), so a missing barrier shows as a mismatch; the order is
// reset to forward afterwards, even when a check throws. In a real-CUDA build on a machine
// without a GPU the check is skipped with a visible MESSAGE ("no CUDA device: skipped").
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cuda/ledger.h"
#include "cuda/runtime.h"
#include "helpers.h"

namespace qk::test {

using Inputs = std::vector<Tensor>;
using DeviceFn = std::function<Tensor(const Inputs&)>;

struct ParityOptions {
    double atol_f32 = 1e-5, rtol_f32 = 1e-4;
    double atol_f64 = 1e-12, rtol_f64 = 1e-10;
    std::vector<bool> requires_grad;  // per input; empty: every floating input
    bool check_grads = true;
    uint64_t probe_seed = 4242;
};

// True when device kernels can run here; otherwise reports the skip once per call site.
inline bool cuda_runnable() {
    if (cuda::device_available()) return true;
    MESSAGE("no CUDA device: skipped (" << std::string(cuda::backend_description()) << ")");
    return false;
}

// Restores the forward run order when a parity check ends, however it ends.
struct RunOrderReset {
    ~RunOrderReset() {
#ifdef QK_CUDA_EMULATION
        qk::emu::set_run_order(qk::emu::RunOrder::forward);
#endif
    }
};

// The run orders a device run is repeated under: three in the emulation, one on a real GPU.
inline std::vector<std::string> parity_run_orders() {
#ifdef QK_CUDA_EMULATION
    return {"forward", "reverse", "random"};
#else
    return {"device"};
#endif
}

inline void set_parity_run_order([[maybe_unused]] const std::string& order) {
#ifdef QK_CUDA_EMULATION
    if (order == "forward") qk::emu::set_run_order(qk::emu::RunOrder::forward);
    if (order == "reverse") qk::emu::set_run_order(qk::emu::RunOrder::reverse);
    if (order == "random") qk::emu::set_run_order(qk::emu::RunOrder::random, 20240611);
#endif
}

// Empty when every element agrees, else a description of the worst one.
inline std::string parity_mismatch(const Tensor& got, const Tensor& want, double atol,
                                   double rtol) {
    if (got.shape() != want.shape())
        return fmt::format("shape {} on cuda, {} on cpu", got.shape(), want.shape());
    if (got.dtype() != want.dtype())
        return fmt::format("dtype {} on cuda, {} on cpu", got.dtype(), want.dtype());
    const auto g = got.to_vector<double>(), w = want.to_vector<double>();
    double worst = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        if (std::isnan(w[i]) || std::isinf(w[i])) {
            const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i];
            if (!same) return fmt::format("element {}: {} on cuda, {} on cpu", i, g[i], w[i]);
            continue;
        }
        const double excess = std::abs(g[i] - w[i]) - (atol + rtol * std::abs(w[i]));
        if (!(excess <= worst)) {  // NaN on the device only counts as a failure too
            worst = std::isnan(excess) ? INFINITY : excess;
            worst_at = i;
        }
    }
    if (worst <= 0) return {};
    return fmt::format(
        "element {} of {} (shape {}): {} on cuda, {} on cpu (|diff| {:.3g}, atol {} "
        "rtol {})",
        worst_at, g.size(), got.shape(), g[worst_at], w[worst_at],
        std::abs(g[worst_at] - w[worst_at]), atol, rtol);
}

// Runs f on cpu_inputs and on their device copies; CHECKs outputs and input gradients.
inline void check_cuda_parity(const std::string& name, const DeviceFn& f, const Inputs& cpu_inputs,
                              const ParityOptions& options = {}) {
    if (!cuda_runnable()) return;
    RunOrderReset reset;
    auto wants_grad = [&](size_t i) {
        if (!options.check_grads || !is_compute_dtype(cpu_inputs[i].dtype())) return false;
        return options.requires_grad.empty() || options.requires_grad.at(i);
    };
    // Fresh leaves on `device`, detached from whatever made the given inputs.
    auto leaves_on = [&](Device device) {
        Inputs leaves;
        for (size_t i = 0; i < cpu_inputs.size(); ++i) {
            Tensor t = cpu_inputs[i].detach();
            t = device == Device::cpu ? t.clone() : t.to(device);
            if (wants_grad(i)) t.requires_grad_();
            leaves.push_back(t);
        }
        return leaves;
    };
    auto any_grad = [&] {
        for (size_t i = 0; i < cpu_inputs.size(); ++i)
            if (wants_grad(i)) return true;
        return false;
    };

    // The reference: the cpu, once.
    const Inputs cpu = leaves_on(Device::cpu);
    const Tensor want = f(cpu);
    REQUIRE_MESSAGE(want.device() == Device::cpu, name, ": f returned a ",
                    std::string(device_name(want.device())), " tensor for cpu inputs");
    Generator gen(options.probe_seed);
    const Tensor probe =
        is_compute_dtype(want.dtype()) ? randn(want.shape(), want.dtype(), gen) : Tensor();
    const bool grads = any_grad() && want.requires_grad();
    if (grads) sum(want * probe).backward();

    const bool f64 = want.dtype() == kF64;
    const double atol = f64 ? options.atol_f64 : options.atol_f32;
    const double rtol = f64 ? options.rtol_f64 : options.rtol_f32;
    for (const std::string& order : parity_run_orders()) {
        set_parity_run_order(order);
        const Inputs dev = leaves_on(Device::cuda);
        const Tensor got = f(dev);
        INFO(name, " (run order: ", order, ")");
        CHECK_MESSAGE(got.device() == Device::cuda, "output is on ",
                      std::string(device_name(got.device())));
        const std::string out_mismatch = parity_mismatch(got, want, atol, rtol);
        CHECK_MESSAGE(out_mismatch.empty(), "output: ", out_mismatch);
        if (!grads) continue;
        sum(got * probe.to(Device::cuda)).backward();
        for (size_t i = 0; i < dev.size(); ++i) {
            if (!wants_grad(i)) continue;
            const Tensor g_cpu = cpu[i].grad(), g_dev = dev[i].grad();
            CHECK_MESSAGE(g_cpu.defined() == g_dev.defined(), "input ", i,
                          ": gradient defined on cpu ", g_cpu.defined(), ", on cuda ",
                          g_dev.defined());
            if (!g_cpu.defined() || !g_dev.defined()) continue;
            CHECK_MESSAGE(g_dev.device() == Device::cuda, "input ", i, ": gradient is on ",
                          std::string(device_name(g_dev.device())));
            const std::string mismatch = parity_mismatch(g_dev, g_cpu, atol, rtol);
            CHECK_MESSAGE(mismatch.empty(), "gradient of input ", i, ": ", mismatch);
        }
    }
}

// Seeded inputs for parity tests (drawn on the cpu).
// The launches `run` makes, from a launch ledger opened around it (cuda/ledger.h).
template <class F>
std::vector<cuda::ledger::Entry> launches_of(F&& run) {
    cuda::ledger::open();
    run();
    return cuda::ledger::close();
}

inline Tensor randn_seeded(const Shape& shape, uint64_t seed, DType dtype = kF32,
                           double scale = 1.0) {
    Generator gen(seed);
    return normal(shape, 0, scale, dtype, gen);
}

// The rounded copy an op kept beside its cuda result (ops/rounded_copy.h): there, of the half type,
// returned by cast_once without a cast of its own, and bit for bit the result's own rounding.
inline void check_kept_rounding(const Tensor& result, DType half) {
    const Storage::CastCopy& kept = result.storage()->cast_copy();
    REQUIRE(kept.storage != nullptr);
    CHECK(kept.dtype == half);
    CHECK(has_kept_cast(result, half));
    const auto kept_storage = kept.storage;
    const Tensor copy = cast_once(result, half);
    CHECK(copy.storage() == kept_storage);
    CHECK(max_abs_diff(copy.to(kF32), result.detach().to(half).to(kF32)) == 0);
}

}  // namespace qk::test
