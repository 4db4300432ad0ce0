// The one cuBLAS header for CUDA-using sources: the real cuBLAS under nvcc, the CPU shim
// (cuda/emu/cublas_emu.h, on top of column-major cblas) in the emulation build.
#pragma once

#include "cuda/emu/cuda_compat.h"

// QK_CUDA_REAL: a host .cpp of the real backend, compiled by g++ against the CUDA toolkit.
#if defined(__CUDACC__) || defined(QK_CUDA_REAL)
#include <cublas_v2.h>
#else
#include "cuda/emu/cublas_emu.h"
#endif
