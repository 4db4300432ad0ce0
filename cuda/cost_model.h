// A GPU cost model for the launch ledger (cuda/ledger.h): an estimate of each launch's time on a
// named GPU from what the ledger knows (grid, block, declared bytes and FLOPs), in the spirit of
// the runtime estimates compilers use to schedule kernels. docs/cuda.md#the-cost-model gives the
// formula and how close it lands against measured launches.
//
//   time = launch + max(bytes / bandwidth, flops / rate, tensor_flops / tensor_rate)
//   bandwidth = min(HBM, threads in flight × bytes a thread keeps in flight / memory latency)
//   rate      = peak × min(1, blocks / SMs)
//
// A grid too small to cover the chip loses both ways: its few SMs get only their share of the
// arithmetic, and its few threads cannot keep enough loads in flight to cover DRAM latency (one
// block of 256 threads reaches a few GB/s, where the whole chip streams at ~4 TB/s: Little's law).
// cuBLAS calls are GEMMs at a measured fraction of peak.
#pragma once

#include <string>
#include <vector>

#include "cuda/ledger.h"

namespace qk::cuda::cost {

struct GpuSpec {
    std::string name;
    int sms = 0;
    int threads_per_sm = 2048;  // resident threads per SM at full occupancy
    double hbm_gbs = 0;         // DRAM bandwidth, GB/s (read + write together)
    double fp32_tflops = 0, fp64_tflops = 0, bf16_tflops = 0;  // dense peaks
    double launch_us = 0;  // a launch's fixed cost on the GPU, back to back
};

// "h100" (H100 SXM, 80 GB) or "h200"; throws qk::Error naming the known ones otherwise.
const GpuSpec& gpu(const std::string& name);
std::vector<std::string> known_gpus();

// The estimated time of one ledger entry, in microseconds. An entry without a declared cost gets
// its launch cost only.
double estimate_us(const ledger::Entry& entry, const GpuSpec& gpu);

// The entries grouped by kernel name (cuBLAS calls by call and shape), most expensive first.
struct KernelRow {
    std::string name;
    long launches = 0;
    long long blocks = 0;  // summed over launches
    double bytes = 0, flops = 0, tensor_flops = 0;
    double estimated_us = 0;
    double measured_us = -1;  // summed, when every launch was timed
    bool float64 = false;     // any launch declared double arithmetic
    long undeclared = 0;      // launches without a declared cost
};
std::vector<KernelRow> by_kernel(const std::vector<ledger::Entry>& entries, const GpuSpec& gpu);

// A Markdown table of by_kernel, with totals: launches, blocks, MB, GFLOP, estimated and (where
// measured) measured milliseconds.
std::string table(const std::vector<ledger::Entry>& entries, const GpuSpec& gpu);

}  // namespace qk::cuda::cost
