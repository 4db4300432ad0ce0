// on_device: the one visible dispatch point of an op whose cpu and cuda paths differ only in the
// kernel they call. Internal to ops/ (not installed).
//
//   on_device("rms_norm", x.device(), x.dtype(),
//       [&](auto tag) { using T = decltype(tag); cpu::rms_norm_forward(y.data<T>(), ...); },
//       [&](auto tag) { using T = decltype(tag); cuda::rms_norm_forward(y.data<T>(), ...); });
//
// Each lambda is called with a value of the element type (float or double, dispatch_float) on its
// device. A build without CUDA never instantiates the cuda lambda and throws "built without CUDA"
// naming the op instead. Ops whose paths differ beyond the call (cross_entropy checks its targets
// on the host first; the fused attention picks a kernel by head size) keep their own `switch`.
#pragma once

#include "core/dtype.h"
#include "core/error.h"

namespace qk {

template <class CpuKernel, class CudaKernel>
void on_device([[maybe_unused]] const char* op, Device device, DType dtype, CpuKernel&& cpu_kernel,
               [[maybe_unused]] CudaKernel&& cuda_kernel) {
    switch (device) {
        case Device::cpu:
            dispatch_float(dtype, cpu_kernel);
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            dispatch_float(dtype, cuda_kernel);
#else
            throw_built_without_cuda(op);
#endif
            break;
    }
}

}  // namespace qk
