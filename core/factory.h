// Tensor factories. Random ones draw from a Generator (the default one unless given), always on
// the cpu in a fixed order, so a seed means the same numbers everywhere.
#pragma once

#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace qk {

Tensor zeros(const Shape& shape, DType dtype = kF32, Device device = Device::cpu);
Tensor ones(const Shape& shape, DType dtype = kF32, Device device = Device::cpu);
Tensor full(const Shape& shape, double value, DType dtype = kF32, Device device = Device::cpu);
Tensor arange(int64_t n, DType dtype = kF32);            // 0, 1, ..., n-1
Tensor scalar_tensor(double value, DType dtype = kF32);  // rank 0
// Row-major values; shape defaults to {values.size()}.
Tensor from_vector(const std::vector<double>& values, Shape shape = {}, DType dtype = kF32);
Tensor from_ids(const std::vector<int32_t>& ids, Shape shape = {});  // int32 token ids

Tensor rand(const Shape& shape, DType dtype = kF32,
            Generator& gen = default_generator());  // U[0,1)
Tensor randn(const Shape& shape, DType dtype = kF32,
             Generator& gen = default_generator());  // N(0,1)
Tensor normal(const Shape& shape, double mean, double std, DType dtype = kF32,
              Generator& gen = default_generator());
Tensor uniform(const Shape& shape, double low, double high, DType dtype = kF32,
               Generator& gen = default_generator());

// The same, made on `device`: drawn on the cpu, then copied, so that a seed gives the same
// tensor on every device.
Tensor rand(const Shape& shape, DType dtype, Device device, Generator& gen = default_generator());
Tensor randn(const Shape& shape, DType dtype, Device device, Generator& gen = default_generator());
Tensor normal(const Shape& shape, double mean, double std, DType dtype, Device device,
              Generator& gen = default_generator());
Tensor uniform(const Shape& shape, double low, double high, DType dtype, Device device,
               Generator& gen = default_generator());

Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor randn_like(const Tensor& t, Generator& gen = default_generator());

// A copy of t on `device` (t itself when already there), not recorded by autograd; see
// Tensor::to(Device) for the differentiable one.
Tensor to_device(const Tensor& t, Device device);

}  // namespace qk
