// Warp-level matrix instructions: the tensor cores' mma.sync, ldmatrix and cp.async, as inline
// PTX under nvcc (sm_80 and sm_90) and emulated exactly under the CPU emulator.
//
// mma_m16n8k16<H>(d, a, b, c):  D = A·B + C for one warp, A: 16 × 16 and B: 16 × 8 of H (bf16 or
//     f16), C and D: 16 × 8 of float. No lane holds a matrix; each holds a fragment, in 32-bit
//     registers of two 16-bit values (the lower index in the low half). With g = lane / 4 (the
//     "group") and t = lane % 4 (the thread in the group), the PTX ISA assigns
//       A:  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//           a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//       B:  b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]           (a column of B per group)
//       C, D (floats): c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
//     so the accumulator of row g sits in the 4 lanes of group g: a row's max or sum over the
//     8 columns is a reduction over those 4 lanes (shuffles with xor 1 and 2).
//
// ldmatrix<N, trans>(r, row):  N (1, 2 or 4) 8 × 8 matrices of 16-bit values from shared memory.
//     Lanes 8m … 8m + 7 give the addresses of matrix m's 8 rows (16 contiguous bytes each, 16-byte
//     aligned); lane l receives r[m] = M_m[g][2t, 2t+1], or with trans M_m[2t, 2t+1][g]. Four
//     matrices of a row-major 16 × 16 tile (lane l pointing at row l % 16, column 8·(l / 16)) are
//     exactly the A fragment above; a row-major (n, k) tile gives B fragments without trans, a
//     row-major (k, n) tile with trans.
//
// cp_async_16(dst, src, valid):  16 bytes from global to shared memory without passing through
//     registers (zeros when !valid: the tails of ragged tiles); cp_async_commit() closes a group
//     of them, cp_async_wait<N>() waits until at most N groups are still in flight. A thread
//     sees its own copies after the wait, other threads' after the wait and a __syncthreads.
//
// The emulator (cuda/emu) runs each lane as a fiber: mma_m16n8k16 and ldmatrix are one warp
// rendezvous (emu::detail::warp_collective) where the last lane to arrive decodes every lane's
// fragment into whole matrices by the table above, computes, and writes each lane's share back.
// mma sums the 16 exact products of a row and column in float32 in k order, starting from C (the
// hardware adds them with more internal precision, in its own order: tests on a GPU allow for
// that, tests in the emulator can reproduce this order exactly). cp.async queues each copy on its
// thread and does it when the thread waits for its group: a read before the wait (or, from another
// thread, before the wait and a barrier) sees the old bytes, and a test fails.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/bfloat16.h"
#include "core/float16.h"
#include "cuda/emu/cuda_compat.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#include <cstring>

#include "core/error.h"
#endif

namespace qk::cuda::mma {

// Two values rounded to H (round to nearest even) in one register, lo in the low half. On the
// GPU one cvt.rn.{bf16x2,f16x2}.f32 instruction; in the emulator the project's own rounding, which
// gives the same bits for every value but NaN (never packed: a NaN row's output is NaN anyway).
template <class H>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
    static_assert(std::is_same_v<H, bf16> || std::is_same_v<H, f16>, "mma: H is bf16 or f16");
#if defined(__CUDA_ARCH__)
    uint32_t bits;
    if constexpr (std::is_same_v<H, bf16>) {
        const __nv_bfloat162 two = __floats2bfloat162_rn(lo, hi);
        memcpy(&bits, &two, sizeof bits);
    } else {
        const __half2 two = __floats2half2_rn(lo, hi);
        memcpy(&bits, &two, sizeof bits);
    }
    return bits;
#else
    return uint32_t(H(lo).bits) | (uint32_t(H(hi).bits) << 16);
#endif
}

#if !defined(__CUDACC__) && !defined(QK_CUDA_REAL)
namespace emulated {

template <class H>
inline float half_value(uint32_t reg, int which) {
    return float(H::from_bits(uint16_t(which ? reg >> 16 : reg & 0xFFFFu)));
}

struct MmaLane {
    float* d;
    const uint32_t* a;
    const uint32_t* b;
    const float* c;
};

template <class H>
void mma_warp(void* const* lanes) {
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const auto& L = *static_cast<const MmaLane*>(lanes[lane]);
        const int g = lane / 4, t = lane % 4;
        for (int h = 0; h < 2; ++h) {
            A[g][2 * t + h] = half_value<H>(L.a[0], h);
            A[g + 8][2 * t + h] = half_value<H>(L.a[1], h);
            A[g][2 * t + 8 + h] = half_value<H>(L.a[2], h);
            A[g + 8][2 * t + 8 + h] = half_value<H>(L.a[3], h);
            B[2 * t + h][g] = half_value<H>(L.b[0], h);
            B[2 * t + 8 + h][g] = half_value<H>(L.b[1], h);
            C[g][2 * t + h] = L.c[h];
            C[g + 8][2 * t + h] = L.c[2 + h];
        }
    }
    for (int lane = 0; lane < 32; ++lane) {  // every c read above: d may alias c
        const auto& L = *static_cast<const MmaLane*>(lanes[lane]);
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 2; ++r)
            for (int h = 0; h < 2; ++h) {
                const int row = g + 8 * r, col = 2 * t + h;
                float acc = C[row][col];
                for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];  // exact products
                L.d[2 * r + h] = acc;
            }
    }
}

struct LdmatrixLane {
    uint32_t* r;
    const void* row;
};

template <int N, bool kTrans>
void ldmatrix_warp(void* const* lanes) {
    uint16_t M[4][8][8];
    for (int m = 0; m < N; ++m)
        for (int row = 0; row < 8; ++row) {
            const void* p = static_cast<const LdmatrixLane*>(lanes[8 * m + row])->row;
            QK_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
                     "cuda emulation: ldmatrix: lane {} gives row address {} of matrix {}, not "
                     "16-byte aligned",
                     8 * m + row, p, m);
            std::memcpy(M[m][row], p, 16);
        }
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t* r = static_cast<const LdmatrixLane*>(lanes[lane])->r;
        for (int m = 0; m < N; ++m) {
            const uint16_t lo = kTrans ? M[m][2 * t][g] : M[m][g][2 * t];
            const uint16_t hi = kTrans ? M[m][2 * t + 1][g] : M[m][g][2 * t + 1];
            r[m] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
    }
}

inline const ::qk::emu::detail::Site kSite{__FILE__, __LINE__, "mma.h warp instruction"};

}  // namespace emulated
#endif

// D = A·B + C on the tensor cores; H is bf16 or f16. d may be c.
template <class H>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2], const float (&c)[4]) {
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<H, bf16>)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%10,%11,%12,%13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
              "f"(c[1]), "f"(c[2]), "f"(c[3]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%10,%11,%12,%13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
              "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
#else
    emulated::MmaLane lane{d, a, b, c};
    ::qk::emu::detail::warp_collective(emulated::kSite, 0xffffffffu, &lane, emulated::mma_warp<H>);
#endif
}

// A place in shared memory as ldmatrix addresses it: a 32-bit byte address on the GPU, a pointer
// in the emulator. Offsets added to it are 32-bit adds, which the compiler folds into the
// instruction's immediate where they are constants; from a generic pointer each load would
// convert the address again (a multiply-add and a shift per ldmatrix in the attention kernels).
struct SharedAddress {
#if defined(__CUDACC__)
    uint32_t at;
#else
    const char* at;
#endif
    __device__ __forceinline__ SharedAddress operator+(int bytes) const { return {at + bytes}; }
};

__device__ __forceinline__ SharedAddress shared_address(const void* p) {
#if defined(__CUDA_ARCH__)
    return {static_cast<uint32_t>(__cvta_generic_to_shared(p))};
#elif defined(__CUDACC__)
    return {0};  // the host pass of nvcc: never run
#else
    return {static_cast<const char*>(p)};
#endif
}

// N 8 × 8 matrices of 16-bit values from shared memory (N = 1, 2, 4), optionally transposed.
template <int N, bool kTrans = false>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], SharedAddress row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: 1, 2 or 4 matrices");
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__)
    if constexpr (N == 1 && !kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                     : "=r"(r[0])
                     : "r"(row.at));
    else if constexpr (N == 1)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                     : "=r"(r[0])
                     : "r"(row.at));
    else if constexpr (N == 2 && !kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(row.at));
    else if constexpr (N == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(row.at));
    else if constexpr (!kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(row.at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(row.at));
#endif
#else
    emulated::LdmatrixLane lane{r, row.at};
    ::qk::emu::detail::warp_collective(emulated::kSite, 0xffffffffu, &lane,
                                       emulated::ldmatrix_warp<N, kTrans>);
#endif
}

template <int N, bool kTrans = false>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
    ldmatrix<N, kTrans>(r, shared_address(row));
}

// 16 bytes global -> shared, asynchronously; zeros in place of the source when !valid.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__)
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
#else
    ::qk::emu::detail::async_copy(dst, src, 16, valid);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::);
#elif !defined(__CUDACC__)
    ::qk::emu::detail::async_commit();
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#elif !defined(__CUDACC__)
    ::qk::emu::detail::async_wait(N);
#endif
}

}  // namespace qk::cuda::mma
