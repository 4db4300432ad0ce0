#include "core/factory.h"

#include <algorithm>

#include "core/strided.h"  // kParallelElementwise
#include "core/threading.h"

namespace qk {

namespace {

template <typename Fill>
Tensor make_cpu(const Shape& shape, DType dtype, Fill&& fill) {
    Tensor t = Tensor::empty(shape, dtype);
    dispatch_all(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data<T>();
        for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(fill(i));
    });
    return t;
}

// One value everywhere. Split over the threads when large: a memory-bound pass (a gradient's
// zeros for a (B, T, 3C) activation is ~10 MB at config B, ~0.4 ms on one thread). make_cpu stays
// serial, because rand and randn draw their values in order from one generator.
Tensor full_cpu(const Shape& shape, double value, DType dtype) {
    Tensor t = Tensor::empty(shape, dtype);
    dispatch_all(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data<T>();
        auto range = [&](int64_t begin, int64_t end) { std::fill(p + begin, p + end, T(value)); };
        parallel_for(t.numel(), range, t.numel() >= kParallelElementwise);
    });
    return t;
}

}  // namespace

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
    if (device == Device::cpu) return full_cpu(shape, value, dtype);
    Tensor t = Tensor::empty(shape, dtype, device);  // filled where it lives: nothing to copy
#ifdef QK_WITH_CUDA
    cuda::fill(t.raw_data(), dtype, t.numel(), value);
#else
    throw_built_without_cuda("full");
#endif
    return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
    return full(shape, 0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
    return full(shape, 1, dtype, device);
}
Tensor scalar_tensor(double value, DType dtype) { return full({}, value, dtype); }

Tensor arange(int64_t n, DType dtype) {
    QK_CHECK(n >= 0, "arange: n must be >= 0, got {}", n);
    return make_cpu({n}, dtype, [](int64_t i) { return static_cast<double>(i); });
}

Tensor from_vector(const std::vector<double>& values, Shape shape, DType dtype) {
    if (shape.empty() && values.size() != 1) shape = {static_cast<int64_t>(values.size())};
    QK_CHECK(numel_of(shape) == static_cast<int64_t>(values.size()),
             "from_vector: {} values do not fill shape {}", values.size(), shape);
    return make_cpu(shape, dtype, [&](int64_t i) { return values[i]; });
}

Tensor from_ids(const std::vector<int32_t>& ids, Shape shape) {
    if (shape.empty()) shape = {static_cast<int64_t>(ids.size())};
    QK_CHECK(numel_of(shape) == static_cast<int64_t>(ids.size()),
             "from_ids: {} ids do not fill shape {}", ids.size(), shape);
    return make_cpu(shape, kI32, [&](int64_t i) { return ids[i]; });
}

Tensor uniform(const Shape& shape, double low, double high, DType dtype, Generator& gen) {
    return make_cpu(shape, dtype, [&](int64_t) { return low + (high - low) * gen.uniform(); });
}
Tensor rand(const Shape& shape, DType dtype, Generator& gen) {
    return uniform(shape, 0, 1, dtype, gen);
}

Tensor normal(const Shape& shape, double mean, double std, DType dtype, Generator& gen) {
    QK_CHECK(std >= 0, "normal: std must be >= 0, got {}", std);
    return make_cpu(shape, dtype, [&](int64_t) { return mean + std * gen.normal(); });
}
Tensor randn(const Shape& shape, DType dtype, Generator& gen) {
    return normal(shape, 0, 1, dtype, gen);
}

Tensor rand(const Shape& shape, DType dtype, Device device, Generator& gen) {
    return to_device(rand(shape, dtype, gen), device);
}
Tensor randn(const Shape& shape, DType dtype, Device device, Generator& gen) {
    return to_device(randn(shape, dtype, gen), device);
}
Tensor normal(const Shape& shape, double mean, double std, DType dtype, Device device,
              Generator& gen) {
    return to_device(normal(shape, mean, std, dtype, gen), device);
}
Tensor uniform(const Shape& shape, double low, double high, DType dtype, Device device,
               Generator& gen) {
    return to_device(uniform(shape, low, high, dtype, gen), device);
}

Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor randn_like(const Tensor& t, Generator& gen) {
    return to_device(randn(t.shape(), t.dtype(), gen), t.device());
}

Tensor to_device(const Tensor& t, Device device) {
    if (t.device() == device) return t;
    Tensor out = Tensor::empty(t.shape(), t.dtype(), device);
    copy_into(out, t);
    return out;
}

}  // namespace qk
