// The launch ledger (cuda/ledger.h): a vector of entries while open, nothing otherwise.
//
// Timing on a real GPU: each launch is bracketed by two CUDA events recorded on the backend's one
// stream, resolved when the ledger closes (cudaEventElapsedTime after one synchronisation). The
// events cost a few microseconds of host time per launch, which a timed step pays and an
// untimed one does not; the GPU time between them is the kernel's own.
#include "cuda/ledger.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "cuda/runtime.h"

namespace qk::cuda::ledger {

namespace {

struct Pending {
    bool set = false;
    double bytes = 0, flops = 0, tensor_flops = 0;
    bool float64 = false;
};

struct State {
    bool open = false, timing = false, dry = false;
    std::vector<Entry> entries;
#if defined(QK_CUDA_REAL)
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events;  // parallel to entries when timing
#endif
};

State& state() {
    static State s;
    return s;
}

thread_local Pending pending;

long record(Entry entry) {
    State& s = state();
    if (pending.set) {
        entry.declared = true;
        entry.bytes = pending.bytes;
        entry.flops = pending.flops;
        entry.tensor_flops = pending.tensor_flops;
        entry.float64 = pending.float64;
        pending = Pending{};
    }
    s.entries.push_back(std::move(entry));
#if defined(QK_CUDA_REAL)
    if (s.timing) {
        cudaEvent_t start = nullptr, stop = nullptr;
        QK_CUDA_CHECK(cudaEventCreate(&start));
        QK_CUDA_CHECK(cudaEventCreate(&stop));
        QK_CUDA_CHECK(cudaEventRecord(start, stream()));
        s.events.emplace_back(start, stop);
    }
#endif
    return static_cast<long>(s.entries.size()) - 1;
}

}  // namespace

void open(bool time_launches, bool dry_run) {
#if defined(QK_CUDA_REAL)
    QK_CHECK(!dry_run, "ledger: a dry run skips launches, which only the emulation build can do");
#endif
    State& s = state();
    s.entries.clear();
    s.open = true;
    s.timing = time_launches;
    s.dry = dry_run;
    pending = Pending{};
}

bool is_open() { return state().open; }
bool dry_run() { return state().open && state().dry; }

std::vector<Entry> close() {
    State& s = state();
    s.open = s.dry = false;
#if defined(QK_CUDA_REAL)
    if (s.timing) {
        synchronize();
        for (size_t i = 0; i < s.events.size() && i < s.entries.size(); ++i) {
            float ms = 0;
            if (cudaEventElapsedTime(&ms, s.events[i].first, s.events[i].second) == cudaSuccess)
                s.entries[i].measured_us = 1e3 * double(ms);
            cudaEventDestroy(s.events[i].first);
            cudaEventDestroy(s.events[i].second);
        }
        s.events.clear();
    }
#endif
    return std::exchange(s.entries, {});
}

void declare(double bytes, double flops, double tensor_flops, bool float64) {
    if (!state().open) return;
    pending = Pending{true, bytes, flops, tensor_flops, float64};
}

Scope::Scope(const char* kernel, const unsigned (&grid)[3], const unsigned (&block)[3],
             std::size_t smem_bytes) {
    if (!state().open) return;
    Entry e;
    e.name = kernel;
    std::copy(grid, grid + 3, e.grid);
    std::copy(block, block + 3, e.block);
    e.smem_bytes = smem_bytes;
    index_ = record(std::move(e));
}

Scope::Scope(const std::string& library_call, const char* library) {
    if (!state().open) return;
    Entry e;
    e.name = std::string(library) + ":" + library_call;
    e.library = true;
    index_ = record(std::move(e));
}

Scope::~Scope() {
#if defined(QK_CUDA_REAL)
    State& s = state();
    if (index_ >= 0 && s.timing && size_t(index_) < s.events.size())
        cudaEventRecord(s.events[size_t(index_)].second, stream());
#endif
}

}  // namespace qk::cuda::ledger
