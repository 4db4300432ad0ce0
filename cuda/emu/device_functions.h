// Device-side intrinsics for the CUDA emulation (included by cuda/emu/cuda_emu.h only): atomics,
// the fast-math and conversion intrinsics glibc lacks, bit tricks and __ldg.
//
// Atomics are real atomics (std::atomic_ref) because blocks may run on a pool of OS threads.
// glibc declares __expf, __logf, __sinf, ... in <math.h> but does not export them, so those names
// become function-like macros onto the plain functions; the names glibc does not know are inline
// functions. The results are the precise ones: the emulator never imitates the GPU's reduced-
// precision approximations.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

// ---- atomics (return the old value, as CUDA does) ----------------------------------------------
inline int atomicAdd(int* address, int value) {
    return std::atomic_ref<int>(*address).fetch_add(value);
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
    return std::atomic_ref<unsigned>(*address).fetch_add(value);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
    return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}
inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}
inline double atomicAdd(double* address, double value) {
    return std::atomic_ref<double>(*address).fetch_add(value);
}
inline int atomicSub(int* address, int value) {
    return std::atomic_ref<int>(*address).fetch_sub(value);
}
inline unsigned atomicSub(unsigned* address, unsigned value) {
    return std::atomic_ref<unsigned>(*address).fetch_sub(value);
}

namespace qk::emu::detail {
// Compare-and-swap loop for the read-modify-write operations std::atomic_ref lacks.
template <typename T, typename F>
T atomic_update(T* address, F f) {
    std::atomic_ref<T> ref(*address);
    T old = ref.load();
    while (!ref.compare_exchange_weak(old, f(old))) {
    }
    return old;
}
}  // namespace qk::emu::detail

inline int atomicMax(int* address, int value) {
    return qk::emu::detail::atomic_update(address, [&](int v) { return v > value ? v : value; });
}
inline unsigned atomicMax(unsigned* address, unsigned value) {
    return qk::emu::detail::atomic_update(address,
                                          [&](unsigned v) { return v > value ? v : value; });
}
inline int atomicMin(int* address, int value) {
    return qk::emu::detail::atomic_update(address, [&](int v) { return v < value ? v : value; });
}
inline unsigned atomicMin(unsigned* address, unsigned value) {
    return qk::emu::detail::atomic_update(address,
                                          [&](unsigned v) { return v < value ? v : value; });
}
inline int atomicExch(int* address, int value) {
    return std::atomic_ref<int>(*address).exchange(value);
}
inline unsigned atomicExch(unsigned* address, unsigned value) {
    return std::atomic_ref<unsigned>(*address).exchange(value);
}
inline float atomicExch(float* address, float value) {
    return std::atomic_ref<float>(*address).exchange(value);
}
inline int atomicCAS(int* address, int compare, int value) {
    std::atomic_ref<int>(*address).compare_exchange_strong(compare, value);
    return compare;
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
    std::atomic_ref<unsigned>(*address).compare_exchange_strong(compare, value);
    return compare;
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
    std::atomic_ref<unsigned long long>(*address).compare_exchange_strong(compare, value);
    return compare;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- math glibc lacks -------------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
// The _rn additions are never fused with the multiply that made either operand (nvcc's contract
// for them); volatile reads keep g++'s contraction from doing it here.
inline float __fadd_rn(float x, float y) {
    const volatile float a = x, b = y;
    return a + b;
}
inline double __dadd_rn(double x, double y) {
    const volatile double a = x, b = y;
    return a + b;
}
// Likewise a _rn product is never fused into the addition that uses it.
inline float __fmul_rn(float x, float y) {
    const volatile float product = x * y;
    return product;
}
inline double __dmul_rn(double x, double y) {
    const volatile double product = x * y;
    return product;
}
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(unsigned x) { return std::countl_zero(x); }
inline int __ffs(unsigned x) { return x == 0 ? 0 : std::countr_zero(x) + 1; }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
// Read-only cached load: a plain load here.
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
// Load that bypasses the SM's L1 (reads what another block wrote): a plain load here.
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}

// Declared by glibc's <math.h> but not exported: map onto the exported functions.
#define __expf(x) ::expf(x)
#define __logf(x) ::logf(x)
#define __log2f(x) ::log2f(x)
#define __log10f(x) ::log10f(x)
#define __sinf(x) ::sinf(x)
#define __cosf(x) ::cosf(x)
#define __tanf(x) ::tanf(x)
#define __powf(x, y) ::powf(x, y)
#define __exp10f(x) ::exp10f(x)
#define __sincosf(x, s, c) ::sincosf(x, s, c)
