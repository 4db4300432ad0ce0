#include "core/tensor.h"

#include <cstring>
#include <map>
#include <type_traits>

#include "core/half_convert.h"
#include "core/strided.h"
#ifdef QK_WITH_CUDA
#include "cuda/ledger.h"
#include "cuda/runtime.h"
#endif

namespace qk {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
    for (int64_t s : shape) QK_CHECK(s >= 0, "empty: negative size in shape {}", shape);
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::make_shared<Storage>(numel_of(shape) * dtype_size(dtype), device);
    impl->shape = shape;
    impl->strides = contiguous_strides(shape);
    impl->dtype = dtype;
    return Tensor(std::move(impl));
}

TensorImpl& Tensor::impl() const {
    QK_CHECK(impl_,
             "Tensor: use of an undefined tensor (for example the .grad() of a tensor "
             "that no backward pass reached)");
    return *impl_;
}

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
    const auto& s = shape();
    const auto& st = strides();
    int64_t expected = 1;
    for (size_t i = s.size(); i-- > 0;) {
        if (s[i] != 1 && st[i] != expected) return false;
        expected *= s[i];
    }
    return true;
}

template <typename T>
T* Tensor::data() const {
    QK_CHECK(dtype() == dtype_of<T>(), "Tensor::data: tensor is {}, asked for {}", dtype(),
             dtype_of<T>());
    return static_cast<T*>(impl().storage->data()) + impl().offset;
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template int32_t* Tensor::data<int32_t>() const;
template bf16* Tensor::data<bf16>() const;
template f16* Tensor::data<f16>() const;

void* Tensor::raw_data() const {
    return static_cast<char*>(impl().storage->data()) + impl().offset * dtype_size(dtype());
}

namespace {

int64_t element_offset(const Tensor& t, std::initializer_list<int64_t> index) {
    QK_CHECK(static_cast<int64_t>(index.size()) == t.dim(),
             "Tensor::at: {} indices given for a tensor of shape {}", index.size(), t.shape());
    QK_CHECK(t.device() == Device::cpu, "Tensor::at: element access needs a cpu tensor, got {}",
             t.device());
    int64_t offset = 0, d = 0;
    for (int64_t i : index) {
        QK_CHECK(i >= 0 && i < t.shape()[d],
                 "Tensor::at: index {} out of range for dim {} of shape {}", i, d, t.shape());
        offset += i * t.strides()[d++];
    }
    return offset;
}

}  // namespace

double Tensor::at(std::initializer_list<int64_t> index) const {
    int64_t off = element_offset(*this, index);
    return dispatch_all(dtype(), [&](auto tag) {
        using T = decltype(tag);
        return static_cast<double>(data<T>()[off]);
    });
}

void Tensor::set(std::initializer_list<int64_t> index, double value) {
    int64_t off = element_offset(*this, index);
    mark_written(*this);
    dispatch_all(dtype(), [&](auto tag) {
        using T = decltype(tag);
        data<T>()[off] = static_cast<T>(value);
    });
}

double Tensor::item() const {
    QK_CHECK(numel() == 1, "Tensor::item: needs exactly one element, tensor has shape {}", shape());
    Tensor c = empty({1}, dtype());  // on the host, whatever device this tensor is on
    copy_into(c, detach().reshape({1}));
    return c.at({0});
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
    Tensor out = empty(shape(), dtype_of<T>());  // on the host: copy_into crosses devices
    copy_into(out, *this);
    return std::vector<T>(out.data<T>(), out.data<T>() + out.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;
template std::vector<f16> Tensor::to_vector<f16>() const;

Tensor& Tensor::requires_grad_(bool on) {
    QK_CHECK(is_leaf(), "requires_grad_: only leaf tensors can be marked; this one was made by {}",
             "an op (use detach() first)");
    impl().requires_grad = on;
    return *this;
}

void Tensor::on_grad_ready(std::function<void()> hook) {
    QK_CHECK(is_leaf() && requires_grad(),
             "on_grad_ready: hooks go on leaves that require grad; this tensor {} {}", shape(),
             is_leaf() ? "does not require grad" : "was made by an op");
    impl().grad_ready_hooks.push_back(std::move(hook));
}

void Tensor::set_grad(const Tensor& g) {
    if (g.defined())
        QK_CHECK(g.shape() == shape(), "set_grad: gradient shape {} differs from tensor shape {}",
                 g.shape(), shape());
    impl().grad = g.impl_ptr();
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = base.storage();
    impl->shape = std::move(shape);
    impl->strides = std::move(strides);
    impl->offset = offset;
    impl->dtype = base.dtype();
    return Tensor(std::move(impl));
}

namespace {

// Both on the cpu.
void copy_cpu(const Tensor& dst, const Tensor& src) {
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
        std::memcpy(dst.raw_data(), src.raw_data(), dst.numel() * dtype_size(dst.dtype()));
        return;
    }
    dispatch_all(dst.dtype(), [&](auto dst_tag) {
        dispatch_all(src.dtype(), [&](auto src_tag) {
            using D = decltype(dst_tag);
            using S = decltype(src_tag);
            D* d = dst.data<D>();
            const S* s = src.data<S>();
            const int64_t ds = dst.dim() ? dst.strides().back() : 1;
            const int64_t ss = src.dim() ? src.strides().back() : 1;
            auto copy_run = [&](const auto& off, int64_t n) {
                D* dp = d + off[0];
                const S* sp = s + off[1];
                if constexpr (std::is_same_v<D, f16> && std::is_same_v<S, float>)
                    if (ds == 1 && ss == 1) return cpu::floats_to_f16(dp, sp, n);
                if constexpr (std::is_same_v<D, float> && std::is_same_v<S, f16>)
                    if (ds == 1 && ss == 1) return cpu::f16_to_floats(dp, sp, n);
                if (ds == 1 && ss == 1)
                    for (int64_t i = 0; i < n; ++i) dp[i] = convert_value<D>(sp[i]);
                else
                    for (int64_t i = 0; i < n; ++i) dp[i * ds] = convert_value<D>(sp[i * ss]);
            };
            // On threads only when no two elements of dst share memory (no stride-0 dim).
            bool overlapping = false;
            for (int64_t k = 0; k < dst.dim(); ++k)
                overlapping |= dst.shape()[k] > 1 && dst.strides()[k] == 0;
            if (overlapping)
                for_each_run<2>(dst.shape(), {&dst.strides(), &src.strides()}, copy_run);
            else
                parallel_for_each_run<2>(dst.shape(), {&dst.strides(), &src.strides()}, copy_run);
        });
    });
}

#ifdef QK_WITH_CUDA
// At least one side on the device. Host <-> device transfers move contiguous bytes of one dtype,
// so a strided or casting side first goes through a contiguous staging tensor on its own device.
void copy_cuda(const Tensor& dst, const Tensor& src) {
    auto plain = [](const Tensor& t, DType dtype) {  // contiguous bytes of dtype as stored
        return t.is_contiguous() && t.dtype() == dtype;
    };
    const std::size_t nbytes = dst.numel() * dtype_size(dst.dtype());
    if (dst.device() == Device::cuda && src.device() == Device::cuda) {
        if (plain(dst, dst.dtype()) && plain(src, dst.dtype()))
            cuda::copy_on_device(dst.raw_data(), src.raw_data(), nbytes);
        else
            cuda::copy_strided(dst.raw_data(), dst.dtype(), dst.strides(), src.raw_data(),
                               src.dtype(), src.strides(), dst.shape());
    } else if (dst.device() == Device::cuda) {  // host -> device
        Tensor host = src;
        if (!plain(src, dst.dtype())) {
            host = Tensor::empty(src.shape(), dst.dtype());
            copy_cpu(host, src);
        }
        Tensor dev =
            plain(dst, dst.dtype()) ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::cuda);
        cuda::copy_to_device(dev.raw_data(), host.raw_data(), nbytes);
        if (!dev.same(dst)) copy_cuda(dst, dev);
    } else {  // device -> host
        Tensor dev = src;
        if (!plain(src, dst.dtype())) {
            dev = Tensor::empty(src.shape(), dst.dtype(), Device::cuda);
            copy_cuda(dev, src);
        }
        Tensor host = plain(dst, dst.dtype()) ? dst : Tensor::empty(dst.shape(), dst.dtype());
        cuda::copy_to_host(host.raw_data(), dev.raw_data(), nbytes);
        if (!host.same(dst)) copy_cpu(dst, host);
    }
}
#endif

}  // namespace

void copy_into(const Tensor& dst, const Tensor& src) {
    QK_CHECK(dst.shape() == src.shape(), "copy: shapes differ: dst {} and src {}", dst.shape(),
             src.shape());
    mark_written(dst);
    if (dst.device() == Device::cpu && src.device() == Device::cpu) return copy_cpu(dst, src);
    if (dst.numel() == 0) return;
#ifdef QK_WITH_CUDA
    copy_cuda(dst, src);
#else
    throw_built_without_cuda("copy");
#endif
}

void copy_into_all(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
    QK_CHECK(dst.size() == src.size(), "copy_into_all: {} destinations for {} sources", dst.size(),
             src.size());
#ifdef QK_WITH_CUDA
    // Device-to-device copies that a memcpy cannot do, by dtype pair; everything else one by one.
    std::map<std::pair<DType, DType>, std::vector<cuda::StridedCopy>> groups;
    for (size_t i = 0; i < dst.size(); ++i) {
        const Tensor &d = dst[i], &s = src[i];
        const bool memcpy = d.is_contiguous() && s.is_contiguous() && d.dtype() == s.dtype();
        if (d.device() != Device::cuda || s.device() != Device::cuda || memcpy ||
            d.shape() != s.shape() || d.numel() == 0) {
            copy_into(d, s);
            continue;
        }
        mark_written(d);
        groups[{d.dtype(), s.dtype()}].push_back(
            {d.raw_data(), d.strides(), s.raw_data(), s.strides(), d.shape()});
    }
    for (const auto& [dtypes, copies] : groups)
        cuda::copy_strided_all(dtypes.first, dtypes.second, copies);
#else
    for (size_t i = 0; i < dst.size(); ++i) copy_into(dst[i], src[i]);
#endif
}

void mark_written(const Tensor& t) { t.storage()->bump_version(); }

bool writes_take_effect([[maybe_unused]] const Tensor& t) {
#ifdef QK_WITH_CUDA
    if (t.device() == Device::cuda && cuda::ledger::dry_run()) return false;
#endif
    return true;
}

bool is_whole_buffer(const Tensor& t) {
    return t.offset() == 0 && t.is_contiguous() &&
           std::size_t(t.numel()) * dtype_size(t.dtype()) == t.storage()->nbytes();
}

bool has_kept_cast(const Tensor& t, DType dtype) {
    if (!is_whole_buffer(t) || dtype == t.dtype()) return false;
    const Storage& storage = *t.storage();
    const Storage::CastCopy& copy = storage.cast_copy();
    return copy.storage && copy.dtype == dtype && copy.version == storage.version() &&
           (!writes_take_effect(t) || !copy.recorded_only);
}

Tensor cast_once(const Tensor& t, DType dtype) {
    if (has_kept_cast(t, dtype)) {
        auto impl = std::make_shared<TensorImpl>();
        impl->storage = t.storage()->cast_copy().storage;
        impl->shape = t.shape();
        impl->strides = t.strides();
        impl->dtype = dtype;
        return Tensor(std::move(impl));
    }
    const Tensor cast = t.detach().to(dtype).detach();
    if (is_whole_buffer(t) && dtype != t.dtype()) keep_cast(t, cast);
    return cast;
}

void keep_cast(const Tensor& t, const Tensor& cast) {
    QK_CHECK(is_whole_buffer(t) && cast.is_contiguous() && cast.shape() == t.shape() &&
                 cast.device() == t.device() && cast.dtype() != t.dtype(),
             "keep_cast: needs a whole-buffer tensor and a contiguous cast of its shape on its "
             "device, got {} {} (whole buffer: {}) and {} {} on {}",
             t.dtype(), t.shape(), is_whole_buffer(t), cast.dtype(), cast.shape(), cast.device());
    t.storage()->cast_copy() = {cast.storage(), cast.dtype(), t.storage()->version(),
                                !writes_take_effect(t)};
}

namespace {

void format_values(std::string& out, const Tensor& t, const std::vector<double>& v, int64_t dim,
                   int64_t& pos) {
    if (t.dim() == 0) {
        out += fmt::format("{:.6g}", v[0]);
        return;
    }
    out += '[';
    const int64_t n = t.shape()[dim];
    for (int64_t i = 0; i < n; ++i) {
        if (i) out += dim + 1 == t.dim() ? ", " : ",\n" + std::string(8 + dim, ' ');
        const bool elided = n > 8 && i == 3;
        if (elided) {  // long dims print their first 3 and last 3 entries
            out += "...";
            int64_t inner = 1;
            for (int64_t d = dim + 1; d < t.dim(); ++d) inner *= t.shape()[d];
            pos += (n - 6) * inner;
            i = n - 4;
            continue;
        }
        if (dim + 1 == t.dim())
            out += fmt::format("{:.6g}", v[pos++]);
        else
            format_values(out, t, v, dim + 1, pos);
    }
    out += ']';
}

}  // namespace

std::string to_string(const Tensor& t) {
    if (!t.defined()) return "tensor(undefined)";
    std::string out = "tensor(";
    std::vector<double> values = t.to_vector<double>();  // copies a cuda tensor to the host
    int64_t pos = 0;
    format_values(out, t, values, 0, pos);
    out += fmt::format(", shape={}, dtype={}", t.shape(), t.dtype());
    if (t.device() != Device::cpu) out += fmt::format(", device={}", t.device());
    if (t.requires_grad()) out += ", requires_grad";
    return out + ")";
}

}  // namespace qk
