// The one cuBLASLt header for CUDA-using sources: the real cuBLASLt under nvcc, the CPU shim
// (cuda/emu/cublaslt_emu.h, on top of the cuBLAS shim) in the emulation build.
#pragma once

#include "cuda/emu/cublas_compat.h"

// QK_CUDA_REAL: a host .cpp of the real backend, compiled by g++ against the CUDA toolkit.
#if defined(__CUDACC__) || defined(QK_CUDA_REAL)
#include <cublasLt.h>
#else
#include "cuda/emu/cublaslt_emu.h"
#endif
