#include "nn/model/module.h"

namespace qk::nn {

Tensor Module::register_parameter(std::string name, Tensor value) {
    value.requires_grad_();
    params_.emplace_back(std::move(name), value);
    return value;
}

Tensor Module::register_buffer(Tensor value) {
    buffers_.push_back(value);
    return value;
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
    for (const auto& [name, value] : params_) out.emplace_back(prefix + name, value);
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<Tensor> Module::buffers() const {
    std::vector<Tensor> out = buffers_;
    for (const auto& [name, child] : children_) {
        const std::vector<Tensor> more = child->buffers();
        out.insert(out.end(), more.begin(), more.end());
    }
    return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
    std::vector<std::pair<std::string, Tensor>> out;
    collect("", out);
    return out;
}

std::vector<Tensor> Module::parameters() const {
    std::vector<Tensor> out;
    for (auto& [name, value] : named_parameters()) out.push_back(value);
    return out;
}

int64_t Module::parameter_count() const {
    int64_t n = 0;
    for (const Tensor& p : parameters()) n += p.numel();
    return n;
}

void Module::zero_grad() {
    for (Tensor& p : parameters()) p.zero_grad();
}

namespace {

// p's handles all see `value`'s data (same shape) from now on.
void replace_data(const Tensor& p, const Tensor& value) {
    TensorImpl& impl = p.impl();  // shared by every handle to this parameter
    impl.storage = value.storage();
    impl.strides = value.strides();
    impl.offset = value.offset();
    impl.dtype = value.dtype();
}

}  // namespace

void Module::to(Device device) {
    for (const std::vector<Tensor>& tensors : {parameters(), buffers()})
        for (const Tensor& t : tensors)
            if (t.device() != device) replace_data(t, t.detach().to(device));
}

void store_parameter_as(const Tensor& p, DType dtype) {
    if (p.dtype() == dtype) return;
    replace_data(p, p.detach().to(dtype));
}

Device Module::device() const {
    const std::vector<Tensor> params = parameters();
    return params.empty() ? Device::cpu : params.front().device();
}

void Module::train(bool on) {
    training_ = on;
    for (auto& [name, child] : children_) child->train(on);
}

}  // namespace qk::nn
