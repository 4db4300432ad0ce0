// The GPU cost model (cuda/cost_model.h).
//
// Constants. Peaks are NVIDIA's datasheet figures (dense, no sparsity) for the SXM parts. The rest
// is calibrated on a measured ledger of the 124M-shaped step on an H200 (docs/cuda.md has the
// table): the memory-bound kernels of the backend (one element per thread: norms, softmax,
// pointwise, AdamW) stream at 1.7–3.3 TB/s, median ~2.4, half the datasheet's 4.8 (a PyTorch
// device copy reaches 4.2); cuBLAS's float32 batched GEMMs at the attention's shapes (1024 × 64
// × 1024 and 1024 × 1024 × 64, all 192 heads in one call) run at 45 and 33 of 67 TFLOP/s (25 when
// called 12 matrices at a time), its bf16 Linear GEMMs at 0.5–0.7 of 989. The
// launch cost is the shortest kernel of an Nsight Compute trace of the same step (1.8 µs, a
// one-block fill). kBytesInFlight and kLatencyUs set how much bandwidth a thread can draw
// (Little's law): a thread of a simple streaming loop keeps about one 16-byte transaction in
// flight, and DRAM answers in about 0.6 µs, so a full H100 (270k threads) is bandwidth bound
// while one 256-thread block is latency bound at ~7 GB/s (a one-block float64 sum of 2.4 M
// values measured 5 ms where this says 2.8).
#include "cuda/cost_model.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "core/error.h"

namespace qk::cuda::cost {

namespace {

constexpr double kBytesInFlight = 16;
constexpr double kLatencyUs = 0.6;
constexpr double kMemoryEfficiency = 0.5;
constexpr double kGemmF32Efficiency = 0.6;
constexpr double kGemmTensorEfficiency = 0.5;
// A half-precision GEMM with a dimension that is not a multiple of 8 (GPT-2's vocabulary of
// 50,257, Tiny Shakespeare's 65) leaves cuBLAS's aligned tensor-core kernels: the head's three
// GEMMs measured 3.2–5.4× their aligned estimate on an H200, at both vocabularies (2026-11-28).
constexpr double kMisalignedGemmSlowdown = 4.0;

const std::vector<GpuSpec>& specs() {
    static const std::vector<GpuSpec> all = {
        {"h100", 132, 2048, 3350, 67, 34, 989, 1.8},
        {"h200", 132, 2048, 4800, 67, 34, 989, 1.8},
    };
    return all;
}

double seconds_to_us(double s) { return s * 1e6; }

// Whether a library entry is a GEMM cuBLAS runs off its aligned kernels: the call says so ("...
// unaligned", cuda/matmul.cu), or, in a ledger written before it did, a dimension of its
// "MxNxK" is not a multiple of 8 (those came with unaligned rows).
bool misaligned_gemm(const std::string& name) {
    if (name.ends_with(" unaligned")) return true;
    if (name.ends_with(" aligned")) return false;
    for (std::size_t at = 0; at < name.size();) {  // each space-separated word
        const std::size_t end = std::min(name.find(' ', at), name.size());
        long long m = 0, n = 0, k = 0;
        int used = 0;
        if (std::sscanf(name.c_str() + at, "%lldx%lldx%lld%n", &m, &n, &k, &used) == 3 &&
            at + std::size_t(used) == end)
            return m % 8 != 0 || n % 8 != 0 || k % 8 != 0;
        at = end + 1;
    }
    return false;
}

}  // namespace

std::vector<std::string> known_gpus() {
    std::vector<std::string> names;
    for (const GpuSpec& s : specs()) names.push_back(s.name);
    return names;
}

const GpuSpec& gpu(const std::string& name) {
    for (const GpuSpec& s : specs())
        if (s.name == name) return s;
    throw Error(fmt::format("cost model: unknown GPU '{}', expected one of {}", name,
                            fmt::join(known_gpus(), ", ")));
}

double estimate_us(const ledger::Entry& e, const GpuSpec& g) {
    if (!e.declared) return g.launch_us;
    const double hbm = g.hbm_gbs * 1e9 * kMemoryEfficiency;  // bytes/s
    if (e.library) {  // a cuBLAS GEMM or a memset: it sizes its own grid; a fraction of peak
        const double tensor_rate = g.bf16_tflops * 1e12 * kGemmTensorEfficiency /
                                   (misaligned_gemm(e.name) ? kMisalignedGemmSlowdown : 1.0);
        const double t =
            std::max({e.bytes / hbm, e.flops / (g.fp32_tflops * 1e12 * kGemmF32Efficiency),
                      e.tensor_flops / tensor_rate});
        return g.launch_us + seconds_to_us(t);
    }
    const double threads = double(e.blocks()) * double(e.threads_per_block());
    const double resident = std::min(threads, double(g.sms) * g.threads_per_sm);
    const double bandwidth = std::min(hbm, resident * kBytesInFlight / (kLatencyUs * 1e-6));
    const double chip = std::min(1.0, double(e.blocks()) / double(g.sms));
    const double peak = (e.float64 ? g.fp64_tflops : g.fp32_tflops) * 1e12;
    const double t = std::max(e.bytes / bandwidth, e.flops / (peak * chip));
    return g.launch_us + seconds_to_us(t);
}

std::vector<KernelRow> by_kernel(const std::vector<ledger::Entry>& entries, const GpuSpec& gpu) {
    std::map<std::string, KernelRow> rows;
    std::map<std::string, bool> all_timed;
    for (const ledger::Entry& e : entries) {
        KernelRow& r = rows[e.name];
        r.name = e.name;
        ++r.launches;
        r.blocks += e.library ? 0 : e.blocks();
        r.bytes += e.bytes;
        r.flops += e.flops;
        r.tensor_flops += e.tensor_flops;
        r.estimated_us += estimate_us(e, gpu);
        r.float64 = r.float64 || e.float64;
        r.undeclared += e.declared ? 0 : 1;
        const bool timed = e.measured_us >= 0;
        auto [it, fresh] = all_timed.emplace(e.name, timed);
        if (!fresh) it->second = it->second && timed;
        if (timed) r.measured_us = std::max(0.0, r.measured_us) + e.measured_us;
    }
    std::vector<KernelRow> out;
    for (auto& [name, r] : rows) {
        if (!all_timed[name]) r.measured_us = -1;
        out.push_back(r);
    }
    std::sort(out.begin(), out.end(), [](const KernelRow& a, const KernelRow& b) {
        const double ta = a.measured_us >= 0 ? a.measured_us : a.estimated_us;
        const double tb = b.measured_us >= 0 ? b.measured_us : b.estimated_us;
        return ta > tb;
    });
    return out;
}

std::string table(const std::vector<ledger::Entry>& entries, const GpuSpec& gpu) {
    const auto rows = by_kernel(entries, gpu);
    std::string s = fmt::format(
        "| kernel | launches | blocks | MB | GFLOP | TC GFLOP | est. ms ({}) | measured ms |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n",
        gpu.name);
    KernelRow total;
    bool measured = !rows.empty();
    for (const KernelRow& r : rows) {
        s += fmt::format("| {}{}{} | {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.3f} | {} |\n", r.name,
                         r.float64 ? " (f64)" : "", r.undeclared ? " (cost undeclared)" : "",
                         r.launches, r.blocks, r.bytes / 1e6, r.flops / 1e9, r.tensor_flops / 1e9,
                         r.estimated_us / 1e3,
                         r.measured_us >= 0 ? fmt::format("{:.3f}", r.measured_us / 1e3) : "-");
        total.launches += r.launches;
        total.blocks += r.blocks;
        total.bytes += r.bytes;
        total.flops += r.flops;
        total.tensor_flops += r.tensor_flops;
        total.estimated_us += r.estimated_us;
        total.measured_us = std::max(0.0, total.measured_us) + std::max(0.0, r.measured_us);
        measured = measured && r.measured_us >= 0;
    }
    s += fmt::format("| **all** | {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.3f} | {} |\n",
                     total.launches, total.blocks, total.bytes / 1e6, total.flops / 1e9,
                     total.tensor_flops / 1e9, total.estimated_us / 1e3,
                     measured ? fmt::format("{:.3f}", total.measured_us / 1e3) : "-");
    return s;
}

}  // namespace qk::cuda::cost
