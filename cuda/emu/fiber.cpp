// Fibers for the CUDA emulation: the x86-64 context switch (ucontext elsewhere) and the stack
// pool. See fiber.h.
#include "cuda/emu/fiber.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "core/error.h"

#ifdef QK_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

#ifdef QK_EMU_ASM_SWITCH
// qk_emu_switch(void** save_sp, void* new_sp): pushes the callee-saved registers and the floating
// point control state on the current stack, stores rsp in *save_sp, then loads new_sp and pops the
// same frame from there. The caller-saved registers need no saving: the switch is a function call.
// ldmxcsr/fldcw stall the pipeline, so they are skipped when the saved words equal the current
// ones (always, unless a kernel changes the rounding mode): half the cost of a switch.
//
// qk_emu_fiber_start is where a fresh fiber "returns" to: prepare() leaves the argument in r12
// and the entry function in r13, and an aligned stack (rsp % 16 == 0 before the call).
asm(R"(
    .text
    .p2align 4
    .globl qk_emu_switch
    .hidden qk_emu_switch
    .type qk_emu_switch, @function
qk_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movl (%rsp), %eax
    movzwl 4(%rsp), %edx
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    cmpl (%rsp), %eax
    jne 1f
    cmpw 4(%rsp), %dx
    je 2f
1:
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
2:
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size qk_emu_switch, .-qk_emu_switch

    .p2align 4
    .globl qk_emu_fiber_start
    .hidden qk_emu_fiber_start
    .type qk_emu_fiber_start, @function
qk_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size qk_emu_fiber_start, .-qk_emu_fiber_start
)");

extern "C" void qk_emu_switch(void** save_sp, void* new_sp);
extern "C" void qk_emu_fiber_start();
#endif

namespace qk::emu::fiber {

#ifdef QK_EMU_ASM_SWITCH

void prepare(Context& ctx, void* stack_base, std::size_t stack_size, void (*entry)(void*),
             void* arg) {
    auto top = (reinterpret_cast<uintptr_t>(stack_base) + stack_size) & ~uintptr_t{15};
    // The frame qk_emu_switch pops, lowest address first: control words, r15, r14, r13, r12,
    // rbx, rbp, return address. 16 spare bytes above keep the start's rsp 16-byte aligned.
    auto* frame = reinterpret_cast<uint64_t*>(top - 16 - 8 * 8);
    uint32_t mxcsr = 0;
    uint16_t fpucw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    frame[0] = mxcsr | (uint64_t{fpucw} << 32);
    frame[1] = 0;                                                // r15
    frame[2] = 0;                                                // r14
    frame[3] = reinterpret_cast<uint64_t>(entry);                // r13
    frame[4] = reinterpret_cast<uint64_t>(arg);                  // r12
    frame[5] = 0;                                                // rbx
    frame[6] = 0;                                                // rbp
    frame[7] = reinterpret_cast<uint64_t>(&qk_emu_fiber_start);  // return address
    ctx.sp = frame;
}

void switch_to(Context& from, Context& to) { qk_emu_switch(&from.sp, to.sp); }

#else

namespace {
// makecontext passes int arguments only; split the two pointers into halves.
void ucontext_start(unsigned e_lo, unsigned e_hi, unsigned a_lo, unsigned a_hi) {
    auto entry = reinterpret_cast<void (*)(void*)>((uintptr_t{e_hi} << 32) | e_lo);
    auto arg = reinterpret_cast<void*>((uintptr_t{a_hi} << 32) | a_lo);
    entry(arg);
}
}  // namespace

void prepare(Context& ctx, void* stack_base, std::size_t stack_size, void (*entry)(void*),
             void* arg) {
    QK_CHECK(getcontext(&ctx.uc) == 0, "cuda emulation: getcontext failed");
    ctx.uc.uc_stack.ss_sp = stack_base;
    ctx.uc.uc_stack.ss_size = stack_size;
    ctx.uc.uc_link = nullptr;
    auto e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
    makecontext(&ctx.uc, reinterpret_cast<void (*)()>(&ucontext_start), 4, unsigned(e),
                unsigned(e >> 32), unsigned(a), unsigned(a >> 32));
}

void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

#endif

namespace {
constexpr std::size_t kStacksPerChunk = 64;
std::size_t page_size() {
    static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return size;
}
}  // namespace

std::size_t StackPool::stack_size() {
#ifdef QK_EMU_ASAN
    return 256 * 1024;  // ASan's redzones make frames several times larger
#else
    return 64 * 1024;
#endif
}

void* StackPool::stack(std::size_t i) {
    while (i >= stacks_.size()) {
        const std::size_t slot = stack_size() + page_size();
        const std::size_t bytes = slot * kStacksPerChunk;
        void* mem =
            mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        QK_CHECK(mem != MAP_FAILED, "cuda emulation: cannot map {} bytes of fiber stacks", bytes);
        auto* base = static_cast<char*>(mem);
        chunks_.push_back({base, bytes});
        for (std::size_t s = 0; s < kStacksPerChunk; ++s) {
            char* guard = base + s * slot;
            mprotect(guard, page_size(), PROT_NONE);
            stacks_.push_back(guard + page_size());
        }
    }
    return stacks_[i];
}

void StackPool::unpoison([[maybe_unused]] std::size_t i) {
#ifdef QK_EMU_ASAN
    if (i < stacks_.size()) ASAN_UNPOISON_MEMORY_REGION(stacks_[i], stack_size());
#endif
}

StackPool::~StackPool() {
    for (const auto& c : chunks_) munmap(c.base, c.bytes);
}

}  // namespace qk::emu::fiber
