// The one cuBLAS header for CUDA-using sources: the real cuBLAS under nvcc, the CPU shim
// (cuda/emu/cublas_emu.h, on top of column-major cblas) in the emulation build.
#pragma once

#include "cuda/emu/cuda_compat.h"

#ifdef __CUDACC__
#include <cublas_v2.h>
#else
#include "cuda/emu/cublas_emu.h"
#endif
