// QK_HOST_DEVICE marks a function callable from both host code and CUDA device code, so that
// one definition (the elementwise math, the bfloat16 rounding) serves the cpu kernels, the
// nvcc-compiled kernels and the emulated ones alike.
#pragma once

#ifdef __CUDACC__
#define QK_HOST_DEVICE __host__ __device__
#else
#define QK_HOST_DEVICE
#endif
