// The CUDA emulation's scheduler: runs a launch block by block, each CUDA thread a fiber, with
// __syncthreads as a counting barrier and warp operations (shuffles, votes, __syncwarp) as a
// rendezvous of the lanes in the mask; detects deadlocks and divergent barriers.
//
// A fiber only gives up the OS thread at a barrier, a warp operation or its exit. The scheduler
// works in passes: each pass resumes every ready fiber once, in the run order (forward, reverse,
// or a seeded random permutation drawn afresh per pass), until all have exited. When a pass finds
// no ready fiber while some still wait, the block is stuck and the waiting sites are reported.
//
// Warp rendezvous: each lane deposits its value and waits; the lane that completes the group
// computes every lane's result at once and releases them. Results are written to per-lane slots
// before anyone resumes, so no second rendezvous is needed to keep values from being overwritten.
#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <memory>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "cuda/emu/emu_internal.h"
#include "cuda/emu/fiber.h"
#include "cuda/emu/scheduler.h"

#ifdef QK_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace qk::emu {

namespace detail {
QK_EMU_TLS thread_local constinit ThreadState tl_state{};
}  // namespace detail

namespace {

using detail::LaunchSpec;
using detail::Rng;
using detail::Site;
using detail::WarpOp;

bool same_site(const Site& a, const Site& b) {
    if (a.line != b.line) return false;
    if (a.file == b.file && a.what == b.what) return true;  // the usual case: the same literals
    return a.file && b.file && a.what && b.what && std::string_view(a.file) == b.file &&
           std::string_view(a.what) == b.what;
}

std::string site_text(const Site& s) { return fmt::format("{} at {}:{}", s.what, s.file, s.line); }

// "16-31" / "3, 5, 7-9" for the set bits of a lane mask.
std::string lane_list(uint32_t mask) {
    std::string out;
    for (int i = 0; i < 32;) {
        if (!((mask >> i) & 1u)) {
            ++i;
            continue;
        }
        int j = i;
        while (j + 1 < 32 && ((mask >> (j + 1)) & 1u)) ++j;
        if (!out.empty()) out += ", ";
        out += i == j ? fmt::format("{}", i) : fmt::format("{}-{}", i, j);
        i = j + 1;
    }
    return out;
}

// ---- the block runner: one per OS thread
// ---------------------------------------------------------

enum class State : uint8_t { ready, wait_block, wait_warp, done };

// One cp.async, done when its thread waits for its group (a read before that sees the old bytes).
struct AsyncCopy {
    void* dst;
    const void* src;
    std::size_t bytes;
    bool valid;  // false: zeros
};

struct Fiber {
    fiber::Context ctx;
    State state = State::ready;
    uint3 tid{};
    Site site{};
    // The pending warp operation.
    WarpOp op = WarpOp::sync;
    unsigned mask = 0;
    int arg = 0;
    int width = 32;
    unsigned size = 4;
    uint64_t value = 0;
    uint64_t result = 0;
    detail::WarpCollective collective = nullptr;
    int pred = 0;
    // cp.async: copies issued and not yet committed, then the committed groups, oldest first.
    std::vector<AsyncCopy> open_copies;
    std::vector<std::vector<AsyncCopy>> copy_groups;
    void* fake_stack = nullptr;  // ASan's fake stack while switched out
};

class BlockRunner;
QK_EMU_TLS thread_local BlockRunner* active_runner = nullptr;

class BlockRunner {
  public:
    void run(const LaunchSpec& spec, uint3 block, RunOrder order, Rng& rng);
    int sync_threads(const Site& site, int pred);
    uint64_t warp_exchange(const Site& site, WarpOp op, unsigned mask, uint64_t bits, unsigned size,
                           int arg, int width, detail::WarpCollective collective = nullptr);
    unsigned active_mask() const {
        const unsigned w = current_ / 32;
        return ~(warp_exited_[w] | absent_lanes(w));
    }
    void* smem() const { return smem_; }
    void async_copy(void* dst, const void* src, std::size_t bytes, bool valid) {
        fibers_[current_].open_copies.push_back({dst, src, bytes, valid});
    }
    void async_commit() {
        Fiber& f = fibers_[current_];
        f.copy_groups.push_back(std::move(f.open_copies));
        f.open_copies.clear();
    }
    void async_wait(int pending);

  private:
    static void entry(void* self);
    void resume(unsigned i);
    void yield();
    void prepare_smem(std::size_t bytes);
    unsigned absent_lanes(unsigned w) const {
        const unsigned tail = n_ % 32;
        return (w + 1 == nwarps_ && tail) ? ~((1u << tail) - 1) : 0u;
    }
    std::string where() const {
        return fmt::format("cuda emulation: kernel '{}' block {}", spec_->kernel_name,
                           detail::format_dim(block_));
    }
    std::string thread_text(unsigned i) const {
        return fmt::format("thread {} (warp {} lane {})", detail::format_dim(fibers_[i].tid),
                           i / 32, i % 32);
    }
    std::string waiting_summary() const;
    [[noreturn]] void report_stall();
    void abandon();

    fiber::Context sched_;
    fiber::StackPool stacks_;
    std::vector<Fiber> fibers_;
    std::vector<unsigned> order_;
    std::vector<uint32_t> warp_waiting_;  // lanes waiting at a warp operation, per warp
    std::vector<uint32_t> warp_exited_;   // lanes that returned from the kernel, per warp
    const LaunchSpec* spec_ = nullptr;
    uint3 block_{};
    unsigned n_ = 0, nwarps_ = 0, current_ = 0, done_ = 0, at_barrier_ = 0;
    int barrier_result_ = 0;
    std::exception_ptr error_;
    std::unique_ptr<unsigned char[]> smem_storage_;
    std::size_t smem_capacity_ = 0;
    unsigned char* smem_ = nullptr;
    std::size_t smem_bytes_ = 0;
    // ASan: the scheduler's own stack, learned when a fiber first starts.
    const void* sched_bottom_ = nullptr;
    std::size_t sched_size_ = 0;
    void* sched_fake_ = nullptr;
};

thread_local BlockRunner runner;

constexpr std::size_t kSmemCanary = 64;  // bytes of 0xA5 after dynamic shared memory

void BlockRunner::prepare_smem(std::size_t bytes) {
    const std::size_t need = bytes + kSmemCanary + 256;
    if (need > smem_capacity_) {
        smem_storage_ = std::make_unique<unsigned char[]>(need);
        smem_capacity_ = need;
    }
    auto addr = reinterpret_cast<uintptr_t>(smem_storage_.get());
    smem_ = smem_storage_.get() + ((256 - addr % 256) % 256);  // 256-byte aligned, like CUDA
    smem_bytes_ = bytes;
    std::memset(smem_, 0xFF, bytes);  // NaN as float or double: reads before writes show
    std::memset(smem_ + bytes, 0xA5, kSmemCanary);
}

void BlockRunner::run(const LaunchSpec& spec, uint3 block, RunOrder order, Rng& rng) {
    spec_ = &spec;
    block_ = block;
    const dim3 bd = spec.block;
    n_ = bd.x * bd.y * bd.z;
    nwarps_ = (n_ + 31) / 32;
    if (fibers_.size() < n_) fibers_.resize(n_);
    warp_waiting_.assign(nwarps_, 0);
    warp_exited_.assign(nwarps_, 0);
    detail::tl_state.block_idx = block;
    detail::tl_state.block_dim = bd;
    detail::tl_state.grid_dim = spec.grid;
    prepare_smem(spec.smem_bytes);
    for (unsigned i = 0; i < n_; ++i) {
        Fiber& f = fibers_[i];
        f.state = State::ready;
        f.tid = {i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
        f.site = {};
        f.fake_stack = nullptr;
        f.open_copies.clear();  // a thread's copies still in flight at its exit are dropped
        f.copy_groups.clear();
        fiber::prepare(f.ctx, stacks_.stack(i), fiber::StackPool::stack_size(), &entry, this);
    }
    done_ = 0;
    at_barrier_ = 0;
    error_ = nullptr;

    active_runner = this;
    for (;;) {
        order_.clear();
        for (unsigned i = 0; i < n_; ++i)
            if (fibers_[i].state == State::ready) order_.push_back(i);
        if (order_.empty()) break;
        if (order == RunOrder::reverse) std::reverse(order_.begin(), order_.end());
        if (order == RunOrder::random) rng.shuffle(order_);
        for (unsigned i : order_) {
            if (fibers_[i].state != State::ready) continue;
            resume(i);
            if (error_) {
                abandon();
                std::rethrow_exception(std::exchange(error_, nullptr));
            }
        }
    }
    if (done_ != n_) report_stall();
    active_runner = nullptr;
    for (std::size_t i = 0; i < kSmemCanary; ++i)
        QK_CHECK(smem_[smem_bytes_ + i] == 0xA5,
                 "{}: wrote past the end of its {} bytes of dynamic shared memory (byte {} past "
                 "the end was overwritten)",
                 where(), smem_bytes_, i);
}

void BlockRunner::async_wait(int pending) {
    Fiber& f = fibers_[current_];
    const std::size_t keep = pending < 0 ? 0 : std::size_t(pending);
    std::size_t done = 0;
    for (; f.copy_groups.size() - done > keep; ++done)
        for (const AsyncCopy& c : f.copy_groups[done]) {
            if (c.valid)
                std::memcpy(c.dst, c.src, c.bytes);
            else
                std::memset(c.dst, 0, c.bytes);
        }
    f.copy_groups.erase(f.copy_groups.begin(), f.copy_groups.begin() + std::ptrdiff_t(done));
}

void BlockRunner::entry(void* self) {
    auto* r = static_cast<BlockRunner*>(self);
#ifdef QK_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &r->sched_bottom_, &r->sched_size_);
#endif
    try {
        r->spec_->body(r->spec_->ctx);
    } catch (...) {
        r->error_ = std::current_exception();
    }
    const unsigned i = r->current_;
    Fiber& f = r->fibers_[i];
    f.state = State::done;
    ++r->done_;
    r->warp_exited_[i / 32] |= 1u << (i % 32);
#ifdef QK_EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, r->sched_bottom_, r->sched_size_);
#endif
    fiber::switch_to(f.ctx, r->sched_);
    __builtin_trap();  // a finished fiber is never resumed
}

void BlockRunner::resume(unsigned i) {
    current_ = i;
    detail::tl_state.thread_idx = fibers_[i].tid;
#ifdef QK_EMU_ASAN
    __sanitizer_start_switch_fiber(&sched_fake_, stacks_.stack(i), fiber::StackPool::stack_size());
#endif
    fiber::switch_to(sched_, fibers_[i].ctx);
#ifdef QK_EMU_ASAN
    __sanitizer_finish_switch_fiber(sched_fake_, nullptr, nullptr);
#endif
}

void BlockRunner::yield() {
    Fiber& f = fibers_[current_];
#ifdef QK_EMU_ASAN
    __sanitizer_start_switch_fiber(&f.fake_stack, sched_bottom_, sched_size_);
#endif
    fiber::switch_to(f.ctx, sched_);
#ifdef QK_EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &sched_bottom_, &sched_size_);
#endif
}

// Fibers stopped mid-kernel are dropped: their stacks are reused by the next block, and whatever
// lived on them is not destroyed (kernels hold only trivially destructible locals).
void BlockRunner::abandon() {
    for (unsigned i = 0; i < n_; ++i)
        if (fibers_[i].state != State::done) stacks_.unpoison(i);
    active_runner = nullptr;
}

int BlockRunner::sync_threads(const Site& site, int pred) {
    Fiber& f = fibers_[current_];
    f.state = State::wait_block;
    f.site = site;
    f.pred = pred;
    if (++at_barrier_ == n_) {
        int count = 0;
        bool same = true;
        for (unsigned j = 0; j < n_; ++j) {
            count += fibers_[j].pred;
            same = same && same_site(fibers_[j].site, site);
        }
        if (!same)
            throw Error(
                fmt::format("{}: divergent __syncthreads: the threads of the block wait at "
                            "different barriers: {}",
                            where(), waiting_summary()));
        barrier_result_ = count;
        at_barrier_ = 0;
        for (unsigned j = 0; j < n_; ++j) fibers_[j].state = State::ready;
    }
    yield();  // the last arrival yields too, so the run order alone decides who goes first
    return barrier_result_;
}

uint64_t BlockRunner::warp_exchange(const Site& site, WarpOp op, unsigned mask, uint64_t bits,
                                    unsigned size, int arg, int width,
                                    detail::WarpCollective collective) {
    const unsigned self = current_, w = self / 32, lane = self % 32, base = w * 32;
    const bool shuffle =
        op == WarpOp::idx || op == WarpOp::up || op == WarpOp::down || op == WarpOp::bfly;
    if (shuffle)
        QK_CHECK(width >= 1 && width <= 32 && std::has_single_bit(unsigned(width)),
                 "{}: {} in {}: width {} is not a power of two in [1, 32]", where(),
                 site_text(site), thread_text(self), width);
    QK_CHECK((mask >> lane) & 1u,
             "{}: {} in {}: the mask 0x{:08x} does not contain the calling lane", where(),
             site_text(site), thread_text(self), mask);
    QK_CHECK(!(mask & absent_lanes(w)),
             "{}: {} in {}: the mask 0x{:08x} names lanes {} that do not exist (the block has {} "
             "threads)",
             where(), site_text(site), thread_text(self), mask, lane_list(mask & absent_lanes(w)),
             n_);
    QK_CHECK(!(mask & warp_exited_[w]),
             "{}: {} in {}: the mask 0x{:08x} names lanes that exited: lanes {} of warp {}",
             where(), site_text(site), thread_text(self), mask, lane_list(mask & warp_exited_[w]),
             w);
    Fiber& f = fibers_[self];
    f.state = State::wait_warp;
    f.site = site;
    f.op = op;
    f.mask = mask;
    f.value = bits;
    f.arg = arg;
    f.width = width;
    f.size = size;
    f.collective = collective;
    uint32_t& waiting = warp_waiting_[w];
    waiting |= 1u << lane;
    // Every waiting lane in this lane's group, and every waiting lane whose group names this lane,
    // must agree on the mask and the operation. Waiting lanes of one group were checked against
    // each other as they arrived, so the lowest of them stands for all.
    auto agree = [&](unsigned j) {
        const Fiber& g = fibers_[base + j];
        QK_CHECK(g.mask == mask && g.op == op && g.width == width && g.collective == collective,
                 "{}: warp {} lanes disagree: lane {} is at {} with mask 0x{:08x} (width {}) "
                 "while lane {} is at {} with mask 0x{:08x} (width {})",
                 where(), w, lane, site_text(site), mask, width, j, site_text(g.site), g.mask,
                 g.width);
    };
    if (const uint32_t in = waiting & mask & ~(1u << lane)) agree(std::countr_zero(in));
    for (uint32_t b = waiting & ~mask; b; b &= b - 1)
        if ((fibers_[base + std::countr_zero(b)].mask >> lane) & 1u) agree(std::countr_zero(b));
    if ((waiting & mask) == mask && op == WarpOp::collective) {
        void* lanes[32] = {};
        for (uint32_t b = mask; b; b &= b - 1)
            lanes[std::countr_zero(b)] =
                reinterpret_cast<void*>(fibers_[base + std::countr_zero(b)].value);
        collective(lanes);
        for (uint32_t b = mask; b; b &= b - 1)
            fibers_[base + std::countr_zero(b)].state = State::ready;
        waiting &= ~mask;
    } else if ((waiting & mask) == mask) {
        uint32_t ballot = 0;
        for (uint32_t b = mask; b; b &= b - 1) {
            const unsigned j = std::countr_zero(b);
            if (fibers_[base + j].value) ballot |= 1u << j;
        }
        const uint64_t poison = size >= 8 ? 0x7FFFFFFFFFFFFFFFull : 0x7FFFFFFFull;
        for (uint32_t b = mask; b; b &= b - 1) {
            const unsigned j = std::countr_zero(b);
            Fiber& g = fibers_[base + j];
            const unsigned seg = j & ~unsigned(g.width - 1), delta = unsigned(g.arg);
            unsigned src = j;
            switch (op) {
                case WarpOp::idx:
                    src = seg + (unsigned(g.arg) & unsigned(g.width - 1));
                    break;
                case WarpOp::up:
                    src = (j - seg) >= delta ? j - delta : j;
                    break;
                case WarpOp::down:
                    src = uint64_t(j - seg) + delta < unsigned(g.width) ? j + delta : j;
                    break;
                case WarpOp::bfly:
                    src = (j ^ delta) < seg + unsigned(g.width) ? (j ^ delta) : j;
                    break;
                default:
                    break;
            }
            switch (op) {
                case WarpOp::sync:
                    g.result = 0;
                    break;
                case WarpOp::ballot:
                    g.result = ballot;
                    break;
                case WarpOp::any:
                    g.result = ballot != 0;
                    break;
                case WarpOp::all:
                    g.result = ballot == mask;
                    break;
                // A source lane outside the mask gives an undefined value on the GPU: poison it.
                default:
                    g.result = ((mask >> src) & 1u) ? fibers_[base + src].value : poison;
            }
        }
        for (uint32_t b = mask; b; b &= b - 1)
            fibers_[base + std::countr_zero(b)].state = State::ready;
        waiting &= ~mask;
    }
    yield();
    return f.result;
}

// "16 threads at __syncthreads at a.cu:10, 16 threads at __syncwarp at a.cu:12; 3 threads exited"
std::string BlockRunner::waiting_summary() const {
    std::vector<std::pair<Site, unsigned>> groups;
    for (unsigned j = 0; j < n_; ++j) {
        const Fiber& g = fibers_[j];
        if (g.state != State::wait_block && g.state != State::wait_warp) continue;
        auto it = std::find_if(groups.begin(), groups.end(),
                               [&](const auto& p) { return same_site(p.first, g.site); });
        if (it == groups.end())
            groups.push_back({g.site, 1});
        else
            ++it->second;
    }
    std::string out;
    for (const auto& [site, count] : groups)
        out += fmt::format("{}{} thread{} at {}", out.empty() ? "" : ", ", count,
                           count == 1 ? "" : "s", site_text(site));
    if (done_) out += fmt::format("; {} thread{} exited", done_, done_ == 1 ? "" : "s");
    return out;
}

void BlockRunner::report_stall() {
    std::string msg;
    unsigned at_block = 0, at_warp = 0;
    for (unsigned j = 0; j < n_; ++j) {
        const Fiber& g = fibers_[j];
        at_block += g.state == State::wait_block;
        at_warp += g.state == State::wait_warp;
        if (msg.empty() && g.state == State::wait_warp && (g.mask & warp_exited_[j / 32]))
            msg = fmt::format(
                "{}: {} in {} waits for lanes that exited: the mask 0x{:08x} names "
                "lanes {} of warp {}",
                where(), site_text(g.site), thread_text(j), g.mask,
                lane_list(g.mask & warp_exited_[j / 32]), j / 32);
    }
    if (msg.empty() && at_block && !at_warp && done_)
        msg = fmt::format(
            "{}: divergent __syncthreads: some threads exited while others wait at "
            "a barrier",
            where());
    if (msg.empty())
        msg = fmt::format(
            "{}: deadlock: no thread can run ({} at __syncthreads, {} at warp "
            "operations)",
            where(), at_block, at_warp);
    msg += "; waiting: " + waiting_summary();
    abandon();
    throw Error(msg);
}

BlockRunner& current_runner(const char* what) {
    QK_CHECK(active_runner, "cuda emulation: {} called outside a kernel", what);
    return *active_runner;
}

}  // namespace

namespace detail {

std::string format_dim(const dim3& d) { return fmt::format("({},{},{})", d.x, d.y, d.z); }

void sync_threads(Site site) { current_runner(site.what).sync_threads(site, 0); }
int sync_threads_count(Site site, int predicate) {
    return current_runner(site.what).sync_threads(site, predicate);
}
void sync_warp(Site site, unsigned mask) {
    current_runner(site.what).warp_exchange(site, WarpOp::sync, mask, 0, 4, 0, 32);
}
uint64_t warp_exchange(Site site, WarpOp op, unsigned mask, uint64_t bits, unsigned size, int arg,
                       int width) {
    return current_runner(site.what).warp_exchange(site, op, mask, bits, size, arg, width);
}
void warp_collective(Site site, unsigned mask, void* lane_data, WarpCollective fn) {
    current_runner(site.what).warp_exchange(site, WarpOp::collective, mask,
                                            reinterpret_cast<uint64_t>(lane_data), 8, 0, 32, fn);
}
void async_copy(void* dst, const void* src, std::size_t bytes, bool valid) {
    current_runner("cp.async").async_copy(dst, src, bytes, valid);
}
void async_commit() { current_runner("cp.async.commit_group").async_commit(); }
void async_wait(int pending) { current_runner("cp.async.wait_group").async_wait(pending); }
unsigned active_mask() { return current_runner("__activemask").active_mask(); }
void* dynamic_shared_memory() { return current_runner("QK_DYNAMIC_SHARED").smem(); }

void run_block(const LaunchSpec& spec, uint3 block, RunOrder order, Rng& rng) {
    runner.run(spec, block, order, rng);
}
bool in_kernel() { return active_runner != nullptr; }

}  // namespace detail
}  // namespace qk::emu
