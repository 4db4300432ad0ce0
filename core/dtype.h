// Element types and devices, and dispatch_float(): the one place a runtime dtype becomes a C++
// type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace qk {

// float32 trains; float64 exists so that gradcheck's finite differences are exact enough;
// int32 holds token ids and targets (embedding, cross_entropy), and is never differentiated.
enum class DType { f32, f64, i32 };
inline constexpr DType kF32 = DType::f32;
inline constexpr DType kF64 = DType::f64;
inline constexpr DType kI32 = DType::i32;

enum class Device { cpu, cuda };

constexpr std::size_t dtype_size(DType d) { return d == DType::f64 ? 8 : 4; }
constexpr std::string_view dtype_name(DType d) {
    return d == DType::f32 ? "float32" : d == DType::f64 ? "float64" : "int32";
}
constexpr bool is_floating(DType d) { return d != DType::i32; }
constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
    return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
    return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
    return DType::i32;
}

// Calls fn(T{}) with T = float or double, matching dtype. Kernels are templates on T:
//   dispatch_float(x.dtype(), [&](auto tag) { using T = decltype(tag); kernel<T>(...); });
template <typename Fn>
decltype(auto) dispatch_float(DType dtype, Fn&& fn) {
    switch (dtype) {
        case DType::f32:
            return fn(float{});
        case DType::f64:
            return fn(double{});
        case DType::i32:
            break;
    }
    throw Error("this op needs a floating-point tensor (float32 or float64), got int32");
}

// Like dispatch_float, with int32 too: for copies, casts and printing.
template <typename Fn>
decltype(auto) dispatch_all(DType dtype, Fn&& fn) {
    if (dtype == DType::i32) return fn(int32_t{});
    return dispatch_float(dtype, std::forward<Fn>(fn));
}

}  // namespace qk

template <>
struct fmt::formatter<qk::DType> : fmt::formatter<std::string_view> {
    auto format(qk::DType d, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(qk::dtype_name(d), ctx);
    }
};
template <>
struct fmt::formatter<qk::Device> : fmt::formatter<std::string_view> {
    auto format(qk::Device d, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(qk::device_name(d), ctx);
    }
};
