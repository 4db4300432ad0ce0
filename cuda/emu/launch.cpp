// Launches in the CUDA emulation: the run-order and worker settings, launch validation, the order
// of the blocks, the optional worker pool, and the red-zone check after every launch.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cuda/emu/emu_internal.h"
#include "cuda/emu/scheduler.h"
#include "cuda/ledger.h"

namespace qk::emu {
namespace {

using detail::LaunchSpec;
using detail::Rng;

// ---- settings: run order (QK_EMU_ORDER) and workers (QK_EMU_WORKERS) ---------------------------

struct Settings {
    std::mutex mutex;
    RunOrder order = RunOrder::forward;
    uint64_t seed = 0;
    uint64_t launches = 0;  // varies the random order from launch to launch, reproducibly
    int workers = 1;
};

Settings& settings() {
    static Settings* s = [] {
        auto* st = new Settings;
        if (const char* env = std::getenv("QK_EMU_ORDER"); env && *env) {
            std::string_view v(env);
            if (v == "forward") {
                st->order = RunOrder::forward;
            } else if (v == "reverse") {
                st->order = RunOrder::reverse;
            } else if (v.starts_with("random")) {
                st->order = RunOrder::random;
                if (v.size() > 7 && v[6] == ':') st->seed = std::strtoull(env + 7, nullptr, 0);
            } else {
                throw Error(
                    fmt::format("cuda emulation: QK_EMU_ORDER='{}' is not one of "
                                "forward, reverse, random[:seed]",
                                v));
            }
        }
        if (const char* env = std::getenv("QK_EMU_WORKERS"); env && *env)
            st->workers = std::max(1, std::atoi(env));
        return st;
    }();
    return *s;
}

std::size_t block_count(const dim3& g) { return std::size_t{g.x} * g.y * g.z; }
uint3 block_at(const dim3& g, std::size_t i) {
    return {unsigned(i % g.x), unsigned((i / g.x) % g.y), unsigned(i / (std::size_t{g.x} * g.y))};
}

void validate(const LaunchSpec& s) {
    const dim3 b = s.block, g = s.grid;
    const std::size_t threads = std::size_t{b.x} * b.y * b.z;
    std::string problem;
    if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
        problem = fmt::format(
            "block {} has {} threads (at most 1024, and each of x, y at most "
            "1024, z at most 64)",
            detail::format_dim(b), threads);
    else if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        problem = fmt::format("grid {} is empty or too large (x < 2^31, y and z at most 65535)",
                              detail::format_dim(g));
    else if (s.smem_bytes > detail::max_dynamic_smem())
        problem = fmt::format(
            "asks for {} bytes of dynamic shared memory (at most {}; raise it "
            "with cudaFuncSetAttribute)",
            s.smem_bytes, detail::max_dynamic_smem());
    if (problem.empty() && !detail::valid_stream(s.stream))
        throw Error(fmt::format("cuda emulation: kernel '{}': {}", s.kernel_name,
                                last_error_message().substr(16)));
    if (problem.empty()) return;
    auto msg = fmt::format("cuda emulation: kernel '{}': invalid launch configuration: {}",
                           s.kernel_name, problem);
    detail::record_error(cudaErrorInvalidConfiguration, msg);
    throw Error(msg);
}

// Runs blocks [order[first], ...) taken one at a time from `next` on this OS thread.
void run_blocks(const LaunchSpec& spec, const std::vector<std::size_t>& order,
                std::atomic<std::size_t>& next, std::atomic<bool>& stop, RunOrder order_kind,
                Rng rng) {
    const bool reverse = order_kind == RunOrder::reverse;
    const std::size_t total = order.empty() ? block_count(spec.grid) : order.size();
    for (std::size_t k; !stop.load() && (k = next.fetch_add(1)) < total;) {
        const std::size_t b = order.empty() ? (reverse ? total - 1 - k : k) : order[k];
        detail::run_block(spec, block_at(spec.grid, b), order_kind, rng);
    }
}

}  // namespace

// ---- public API ------------------------------------------------------------------------------

void set_run_order(RunOrder order, uint64_t seed) {
    Settings& s = settings();
    std::lock_guard lock(s.mutex);
    s.order = order;
    s.seed = seed;
    s.launches = 0;
}
RunOrder run_order() { return settings().order; }
uint64_t run_order_seed() { return settings().seed; }

void set_workers(int workers) {
    Settings& s = settings();
    std::lock_guard lock(s.mutex);
    s.workers = std::max(1, workers);
}
int workers() { return settings().workers; }

namespace detail {

void launch_erased(const LaunchSpec& spec) {
    validate(spec);
    if (qk::cuda::ledger::dry_run()) return;  // recorded by the ledger, not run
    QK_CHECK(!in_kernel(),
             "cuda emulation: kernel '{}' launched from inside a kernel (dynamic parallelism is "
             "not emulated)",
             spec.kernel_name);
    Settings& s = settings();
    Rng rng{0};
    int workers = 1;
    RunOrder order;
    {
        std::lock_guard lock(s.mutex);
        order = s.order;
        rng.state = s.seed * 0x9E3779B97F4A7C15ull + ++s.launches;
        workers = s.workers;
    }
    std::vector<std::size_t> block_order;
    if (order == RunOrder::random) {
        block_order.resize(block_count(spec.grid));
        for (std::size_t i = 0; i < block_order.size(); ++i) block_order[i] = i;
        rng.shuffle(block_order);
    }
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    try {
        const std::size_t total = block_count(spec.grid);
        const int extra = static_cast<int>(std::min<std::size_t>(workers, total)) - 1;
        if (extra <= 0) {
            run_blocks(spec, block_order, next, stop, order, rng);
        } else {
            // Optional pool: blocks are shared out one at a time; the first error stops the rest.
            std::vector<std::exception_ptr> errors(extra + 1);
            auto work = [&](int w, uint64_t seed) {
                try {
                    run_blocks(spec, block_order, next, stop, order, Rng{seed});
                } catch (...) {
                    errors[w] = std::current_exception();
                    stop = true;
                }
            };
            std::vector<std::thread> pool;
            for (int w = 1; w <= extra; ++w) pool.emplace_back(work, w, rng.next());
            work(0, rng.next());
            for (auto& t : pool) t.join();
            for (auto& e : errors)
                if (e) std::rethrow_exception(e);
        }
    } catch (...) {
        check_red_zones(spec.kernel_name);  // restores them; the first report wins
        throw;
    }
    if (auto report = check_red_zones(spec.kernel_name); !report.empty()) throw Error(report);
}

}  // namespace detail
}  // namespace qk::emu
