// The launch ledger: every kernel launch (the one QK_LAUNCH path), every cuBLAS call and every
// device memset of the backend, recorded while a ledger is open, with its grid, block, shared
// memory and the cost its call site declares (bytes read + written, CUDA-core FLOPs, tensor-core
// FLOPs). On a real GPU a ledger can also time each launch with a pair of CUDA events; the emulator
// records the same entries, so a step's launches are counted on every machine. cuda/cost_model.h
// turns entries into estimated microseconds for a named GPU (docs/cuda.md#the-launch-ledger).
//
// Included by cuda/emu/cuda_compat.h; host code only, no CUDA header needed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace qk::cuda::ledger {

struct Entry {
    std::string name;  // the kernel as written at QK_LAUNCH (template arguments as in the source),
                       // or "cublas:<call> <types>" for a library call, "cuda:memset" for a memset
    unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
    std::size_t smem_bytes = 0;
    bool library = false;     // a cuBLAS call or a memset: its grid is the library's business
    bool declared = false;    // whether the call site declared its cost
    double bytes = 0;         // read + written, as declared
    double flops = 0;         // on CUDA cores (float32 or float64)
    double tensor_flops = 0;  // on tensor cores (bf16 / fp16 inputs, float32 sums)
    bool float64 = false;     // the kernel computes in double (declared)
    double measured_us = -1;  // with timing on a real GPU; -1: not measured

    long long blocks() const { return 1LL * grid[0] * grid[1] * grid[2]; }
    long long threads_per_block() const { return 1LL * block[0] * block[1] * block[2]; }
};

// Open a ledger (clearing any previous one); `time_launches` brackets each launch with CUDA events
// on a real GPU (ignored by the emulator). Not thread-safe: open it around single-threaded work.
// `dry_run` (the emulator only; refused by a real build) records every launch without running
// it: kernels, cuBLAS products, device memsets and device-to-device copies are skipped, and new
// device memory is not filled, so a step of a model far too large to emulate yields its ledger in
// seconds (its values are garbage; host code that branches on them is the caller's business).
void open(bool time_launches = false, bool dry_run = false);
// Whether launches are being skipped (an open dry-run ledger).
bool dry_run();
// Close it and return its entries in launch order, with measured times resolved (synchronises).
std::vector<Entry> close();
bool is_open();

// The cost of the next launch on this thread (call right before QK_LAUNCH or the cuBLAS call):
// bytes read + written, CUDA-core FLOPs, tensor-core FLOPs. Cheap when no ledger is open.
void declare(double bytes, double flops = 0, double tensor_flops = 0, bool float64 = false);

// The usual declaration of a kernel over elements of T: `read` and `written` elements (each counted
// once: what reaches DRAM, caches aside), `flops` CUDA-core FLOPs, float64 when T is double.
template <class T>
void declare_elements(double read, double written, double flops = 0) {
    declare(double(sizeof(T)) * (read + written), flops, 0, sizeof(T) == 8);
}

// Brackets one launch: records the entry (with the pending declaration) when a ledger is open,
// and times it when asked. QK_LAUNCH makes one; cuBLAS wrappers make the library form.
class Scope {
  public:
    Scope(const char* kernel, const unsigned (&grid)[3], const unsigned (&block)[3],
          std::size_t smem_bytes);
    // A library call, named "<library>:<call>": cuBLAS's GEMMs, the runtime's memsets ("cuda").
    explicit Scope(const std::string& library_call, const char* library = "cublas");
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

  private:
    long index_ = -1;  // the entry's index, -1 when not recording
};

}  // namespace qk::cuda::ledger
