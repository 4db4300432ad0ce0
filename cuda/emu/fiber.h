// Fibers for the CUDA emulation (internal): a context switch and a pool of reusable stacks.
//
// On x86-64 the switch is a dozen instructions of hand-written assembly (callee-saved registers,
// rsp, MXCSR and the x87 control word); elsewhere it falls back to ucontext. Under AddressSanitizer
// every switch is announced with __sanitizer_start/finish_switch_fiber so ASan follows the stacks.
#pragma once

#include <cstddef>
#include <vector>

#if defined(__x86_64__) && !defined(QK_EMU_USE_UCONTEXT)
#define QK_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define QK_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QK_EMU_ASAN 1
#endif
#endif

namespace qk::emu::fiber {

// A suspended execution: for the assembly switch only its saved stack pointer.
struct Context {
#ifdef QK_EMU_ASM_SWITCH
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

// Makes ctx start entry(arg) on the stack [base, base + size) at its next switch_to. entry must
// never return: it ends by switching away for good.
void prepare(Context& ctx, void* stack_base, std::size_t stack_size, void (*entry)(void*),
             void* arg);
// Saves the running execution into from and resumes to.
void switch_to(Context& from, Context& to);

// One OS thread's stacks, reused from launch to launch: each is mmap'd with a PROT_NONE guard
// page below it, so an overflow faults instead of silently corrupting a neighbour.
class StackPool {
  public:
    StackPool() = default;
    StackPool(const StackPool&) = delete;
    StackPool& operator=(const StackPool&) = delete;
    ~StackPool();
    // The lowest usable address of stack i (grows the pool as needed).
    void* stack(std::size_t i);
    static std::size_t stack_size();
    // Clears ASan's shadow of stack i: fibers abandoned mid-kernel leave poisoned frames behind.
    void unpoison(std::size_t i);

  private:
    struct Chunk {
        char* base;
        std::size_t bytes;
    };
    std::vector<Chunk> chunks_;
    std::vector<char*> stacks_;
};

}  // namespace qk::emu::fiber
