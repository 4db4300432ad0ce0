// Device memory for the CUDA emulation: cudaMalloc/cudaFree over an arena of its own, so that the
// emulator can tell device from host pointers and catch writes past an allocation.
//
// The arena is one reserved range of address space (64 GiB, committed 64 MiB at a time); a
// pointer inside it is "device", anything else "host". Each allocation is 256-byte aligned (as in
// CUDA) and sits between red zones of at least 256 canary bytes; every launch checks all red zones
// afterwards and cudaFree checks its own, so a kernel that writes past an allocation is reported
// with the kernel's name, the allocation's size and how far past the end it wrote. New memory is
// filled with 0xFF bytes (NaN as float) so reads of unwritten memory show. Freed blocks wait in a
// quarantine before reuse so that a second cudaFree, or a freed pointer passed to a kernel, is
// recognised as such.
#include <sys/mman.h>

#include <array>
#include <deque>
#include <map>
#include <mutex>

#include "core/error.h"
#include "cuda/emu/emu_internal.h"
#include "cuda/ledger.h"

namespace qk::emu {
namespace {

constexpr std::size_t kReserve = std::size_t{64} << 30;
constexpr std::size_t kCommitStep = std::size_t{64} << 20;
constexpr std::size_t kAlign = 256;  // cudaMalloc's alignment, and the red zone size
constexpr std::size_t kQuarantineBytes = std::size_t{256} << 20;
constexpr std::size_t kQuarantineCount = 4096;

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

// The canary byte for an address: varies along the red zone so that no repeated value written
// over it goes unnoticed, and never takes a byte value common in data: zero, 0xFF, and the top
// and bottom bytes of small floats and bf16 (0x3F, 0x40, 0x7F, 0x80, 0xBF, 0xC0). A plain hash
// of the address matched 1.0f's low byte (0x00) one time in 256, and a report then began a byte
// late; a byte from that set is always seen as written.
constexpr std::array<unsigned char, 248> kCanaryBytes = [] {
    std::array<unsigned char, 248> bytes{};
    std::size_t n = 0;
    for (int b = 0; b < 256; ++b)
        if (b != 0x00 && b != 0xFF && b != 0x3F && b != 0x40 && b != 0x7F && b != 0x80 &&
            b != 0xBF && b != 0xC0)
            bytes[n++] = static_cast<unsigned char>(b);
    return bytes;
}();
unsigned char canary(uintptr_t a) {
    const uint32_t hash = static_cast<uint32_t>(a) * 0x9E3779B1u;
    return kCanaryBytes[(hash >> 16) % kCanaryBytes.size()];
}
void fill_canary(uintptr_t lo, uintptr_t hi) {
    for (uintptr_t a = lo; a < hi; ++a) *reinterpret_cast<unsigned char*>(a) = canary(a);
}
// The first and last overwritten byte in [lo, hi), or {0, 0} when intact.
std::pair<uintptr_t, uintptr_t> damaged(uintptr_t lo, uintptr_t hi) {
    uintptr_t first = 0, last = 0;
    for (uintptr_t a = lo; a < hi; ++a)
        if (*reinterpret_cast<const unsigned char*>(a) != canary(a)) {
            if (!first) first = a;
            last = a;
        }
    return {first, last};
}

struct Alloc {
    uintptr_t block;         // start of the front red zone
    std::size_t block_size;  // red zones included
    std::size_t size;        // bytes asked for
};

class Arena {
  public:
    static Arena& get() {
        static Arena* arena = new Arena;  // never destroyed: frees may come from static dtors
        return *arena;
    }

    std::mutex mutex;
    std::map<uintptr_t, Alloc> live;   // by user pointer
    std::map<uintptr_t, Alloc> freed;  // quarantined, by user pointer
    std::size_t live_bytes = 0;

    bool contains(uintptr_t p) const { return p >= base_ && p < base_ + kReserve; }

    // nullptr when the arena is exhausted.
    void* allocate(std::size_t size) {
        std::size_t block_size = kAlign + round_up(std::max<std::size_t>(size, 1), kAlign) + kAlign;
        uintptr_t block = take_free(block_size);
        if (!block) {
            if (used_ + block_size > kReserve) return nullptr;
            while (used_ + block_size > committed_) {
                if (mprotect(reinterpret_cast<void*>(base_ + committed_), kCommitStep,
                             PROT_READ | PROT_WRITE) != 0)
                    return nullptr;
                committed_ += kCommitStep;
            }
            block = base_ + used_;
            used_ += block_size;
        }
        const uintptr_t user = block + kAlign;
        fill_canary(block, user);
        // A dry-run ledger (cuda/ledger.h) leaves the pages untouched: a 124M model's step fits.
        if (!qk::cuda::ledger::dry_run()) std::memset(reinterpret_cast<void*>(user), 0xFF, size);
        fill_canary(user + size, block + block_size);
        live[user] = {block, block_size, size};
        live_bytes += size;
        return reinterpret_cast<void*>(user);
    }

    // Moves a live allocation to the quarantine; the oldest quarantined blocks become free.
    void retire(std::map<uintptr_t, Alloc>::iterator it) {
        const auto [user, a] = *it;
        live.erase(it);
        live_bytes -= a.size;
        if (!qk::cuda::ledger::dry_run()) std::memset(reinterpret_cast<void*>(user), 0xFF, a.size);
        freed[user] = a;
        quarantine_.push_back(user);
        quarantine_bytes_ += a.block_size;
        while (quarantine_bytes_ > kQuarantineBytes || quarantine_.size() > kQuarantineCount) {
            auto old = freed.find(quarantine_.front());
            quarantine_.pop_front();
            quarantine_bytes_ -= old->second.block_size;
            release(old->second.block, old->second.block_size);
            freed.erase(old);
        }
    }

  private:
    Arena() {
        void* mem =
            mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED)
            throw Error(
                fmt::format("cuda emulation: cannot reserve {} bytes for device memory", kReserve));
        base_ = reinterpret_cast<uintptr_t>(mem);
    }

    // A free block of at least `size` bytes, or 0; `size` grows to include slack not worth
    // splitting off (it joins the rear red zone).
    uintptr_t take_free(std::size_t& size) {
        auto it = by_size_.lower_bound(size);
        if (it == by_size_.end()) return 0;
        const auto [have, block] = *it;
        by_size_.erase(it);
        by_addr_.erase(block);
        if (have - size >= 4 * kAlign)
            insert_free(block + size, have - size);
        else
            size = have;
        return block;
    }

    void insert_free(uintptr_t block, std::size_t size) {
        by_addr_[block] = size;
        by_size_.emplace(size, block);
    }
    void erase_free(uintptr_t block, std::size_t size) {
        by_addr_.erase(block);
        for (auto [lo, hi] = by_size_.equal_range(size); lo != hi; ++lo)
            if (lo->second == block) {
                by_size_.erase(lo);
                break;
            }
    }

    // Returns a block to the free lists, merged with free neighbours.
    void release(uintptr_t block, std::size_t size) {
        auto next = by_addr_.lower_bound(block);
        if (next != by_addr_.end() && next->first == block + size) {
            size += next->second;
            erase_free(next->first, next->second);
        }
        auto prev = by_addr_.lower_bound(block);
        if (prev != by_addr_.begin()) {
            --prev;
            if (prev->first + prev->second == block) {
                block = prev->first;
                size += prev->second;
                erase_free(prev->first, prev->second);
            }
        }
        insert_free(block, size);
        // Give large free ranges back to the OS (they read as zeros until reused and refilled).
        if (size >= (std::size_t{1} << 20)) {
            const uintptr_t lo = round_up(block, 4096), hi = (block + size) / 4096 * 4096;
            if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
        }
    }

    uintptr_t base_ = 0;
    std::size_t committed_ = 0, used_ = 0;
    std::deque<uintptr_t> quarantine_;
    std::size_t quarantine_bytes_ = 0;
    std::map<uintptr_t, std::size_t> by_addr_;
    std::multimap<std::size_t, uintptr_t> by_size_;
};

// The allocation in m that contains p (one past the end included), or m.end().
std::map<uintptr_t, Alloc>::const_iterator containing(const std::map<uintptr_t, Alloc>& m,
                                                      uintptr_t p) {
    auto it = m.upper_bound(p);
    if (it == m.begin()) return m.end();
    --it;
    return p <= it->first + it->second.size ? it : m.end();
}

// The red-zone report for one allocation, empty when intact; restores the canaries.
std::string red_zone_report(const char* who, uintptr_t user, const Alloc& a) {
    std::string msg;
    if (auto [first, last] = damaged(user + a.size, a.block + a.block_size); first) {
        msg = fmt::format(
            "{} wrote past the end of a device allocation of {} bytes at {:#x}: "
            "bytes {} to {} past the end were overwritten",
            who, a.size, user, first - (user + a.size), last - (user + a.size));
        fill_canary(user + a.size, a.block + a.block_size);
    }
    if (auto [first, last] = damaged(a.block, user); first) {
        if (msg.empty())
            msg = fmt::format(
                "{} wrote before the start of a device allocation of {} bytes at "
                "{:#x}: bytes {} to {} before the start were overwritten",
                who, a.size, user, user - first, user - last);
        fill_canary(a.block, user);
    }
    return msg;
}

}  // namespace

std::size_t live_device_bytes() {
    Arena& arena = Arena::get();
    std::lock_guard lock(arena.mutex);
    return arena.live_bytes;
}

std::size_t live_device_allocations() {
    Arena& arena = Arena::get();
    std::lock_guard lock(arena.mutex);
    return arena.live.size();
}

bool is_device_pointer(const void* p) { return detail::classify(p).where == detail::Where::device; }

namespace detail {

PointerInfo classify(const void* ptr) {
    Arena& arena = Arena::get();
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    if (!arena.contains(p)) return {};
    std::lock_guard lock(arena.mutex);
    if (auto it = containing(arena.live, p); it != arena.live.end())
        return {Where::device, it->first, it->second.size, p - it->first};
    if (auto it = containing(arena.freed, p); it != arena.freed.end())
        return {Where::freed, it->first, it->second.size, p - it->first};
    return {Where::red_zone, 0, 0, 0};
}

std::string describe(const void* p, const PointerInfo& info) {
    switch (info.where) {
        case Where::host:
            return fmt::format("a host pointer {}", p);
        case Where::device:
            return fmt::format("device memory {} (offset {} in an allocation of {} bytes)", p,
                               info.offset, info.size);
        case Where::freed:
            return fmt::format(
                "freed device memory {} (offset {} in a freed allocation of {} "
                "bytes)",
                p, info.offset, info.size);
        case Where::red_zone:
            return fmt::format("{}, inside the device arena but in no allocation (a red zone)", p);
    }
    return {};
}

void check_pointer_argument(const char* kernel_name, std::size_t index, const void* p) {
    if (!p) return;
    const PointerInfo info = classify(p);
    if (info.where == Where::device) return;
    throw Error(
        fmt::format("cuda emulation: kernel '{}': argument {} is {}, not device memory "
                    "from cudaMalloc",
                    kernel_name, index, describe(p, info)));
}

void require_device_range(const char* api, const char* what, const void* p, std::size_t bytes) {
    const PointerInfo info = classify(p);
    if (info.where != Where::device)
        throw Error(fmt::format("cuda emulation: {}: {} is {}, not device memory from cudaMalloc",
                                api, what, describe(p, info)));
    if (info.offset + bytes > info.size)
        throw Error(
            fmt::format("cuda emulation: {}: {} spans {} bytes from offset {} of a device "
                        "allocation of {} bytes: it runs {} bytes past the end",
                        api, what, bytes, info.offset, info.size, info.offset + bytes - info.size));
}

std::string check_red_zones(const char* kernel_name) {
    Arena& arena = Arena::get();
    std::lock_guard lock(arena.mutex);
    const std::string who = fmt::format("cuda emulation: kernel '{}'", kernel_name);
    std::string first;
    for (const auto& [user, a] : arena.live)
        if (auto msg = red_zone_report(who.c_str(), user, a); first.empty()) first = msg;
    return first;
}

}  // namespace detail
}  // namespace qk::emu

using qk::emu::detail::record_error;

cudaError_t cudaMalloc(void** dev_ptr, std::size_t bytes) {
    if (!dev_ptr) return record_error(cudaErrorInvalidValue, "cudaMalloc: dev_ptr is null");
    *dev_ptr = nullptr;
    if (bytes == 0) return cudaSuccess;  // as CUDA: success, and a null pointer
    auto& arena = qk::emu::Arena::get();
    std::lock_guard lock(arena.mutex);
    *dev_ptr = arena.allocate(bytes);
    if (!*dev_ptr)
        return record_error(cudaErrorMemoryAllocation,
                            fmt::format("cudaMalloc: cannot allocate {} bytes ({} bytes live)",
                                        bytes, arena.live_bytes));
    return cudaSuccess;
}

cudaError_t cudaFree(void* dev_ptr) {
    using namespace qk::emu;
    if (!dev_ptr) return cudaSuccess;
    auto& arena = Arena::get();
    const auto p = reinterpret_cast<uintptr_t>(dev_ptr);
    std::unique_lock lock(arena.mutex);
    if (auto it = arena.live.find(p); it != arena.live.end()) {
        // A damaged red zone here was written by host code (launches check their own).
        auto msg = red_zone_report("cuda emulation: cudaFree: host code", p, it->second);
        arena.retire(it);
        if (!msg.empty()) throw qk::Error(msg);
        return cudaSuccess;
    }
    std::string why;
    if (!arena.contains(p))
        why = fmt::format("{} is a host pointer, not device memory from cudaMalloc", dev_ptr);
    else if (auto it = arena.freed.find(p); it != arena.freed.end())
        why = fmt::format("{} was already freed (an allocation of {} bytes): double free", dev_ptr,
                          it->second.size);
    else if (auto in = containing(arena.live, p); in != arena.live.end())
        why = fmt::format(
            "{} is not the start of an allocation (offset {} in an allocation of {} "
            "bytes)",
            dev_ptr, p - in->first, in->second.size);
    else
        why = fmt::format("{} does not point to a live device allocation", dev_ptr);
    lock.unlock();
    return record_error(cudaErrorInvalidValue, "cudaFree: " + why);
}
