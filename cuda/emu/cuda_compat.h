// The one CUDA header that every .cu source and every CUDA-using .cpp includes.
//
// Under nvcc (__CUDACC__) it is the real runtime plus the two project macros written the nvcc way;
// under g++ it is the CPU emulation layer (cuda/emu/cuda_emu.h), which defines the same macros so
// that one kernel source builds both ways:
//   QK_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)   a kernel launch (a statement,
//                                                                  recorded by an open ledger)
//   QK_DYNAMIC_SHARED(T, name)                                     `name` is the dynamic smem, T[]
//   QK_UNROLL                                                      before a loop nvcc must unroll
//                                                                  (#pragma unroll; nothing in g++)
// A kernel that is a template-id with commas is passed in parentheses: QK_LAUNCH((k<float, 4>),
// ...).
#pragma once

// QK_CUDA_REAL: a host .cpp of the real backend, compiled by g++ against the CUDA toolkit.
#if defined(__CUDACC__) || defined(QK_CUDA_REAL)

#include <cuda_runtime.h>

#include "cuda/ledger.h"

// The launch, bracketed by a ledger scope (cuda/ledger.h): nothing happens in it unless a ledger
// is open.
#define QK_LAUNCH(kernel, grid, block, smem_bytes, stream, ...)                               \
    do {                                                                                      \
        const ::dim3 qk_grid = ::dim3(grid), qk_block = ::dim3(block);                        \
        const ::qk::cuda::ledger::Scope qk_ledger_scope(                                      \
            #kernel, {qk_grid.x, qk_grid.y, qk_grid.z}, {qk_block.x, qk_block.y, qk_block.z}, \
            (smem_bytes));                                                                    \
        kernel<<<qk_grid, qk_block, (smem_bytes), (stream)>>>(__VA_ARGS__);                   \
    } while (0)
#define QK_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#if defined(__CUDACC__)
#define QK_UNROLL _Pragma("unroll")
#else
#define QK_UNROLL
#endif

#else

#define QK_UNROLL

#include "cuda/emu/cuda_emu.h"

#endif
