#include "nn/module.h"

namespace qk::nn {

Tensor Module::register_parameter(std::string name, Tensor value) {
    value.requires_grad_();
    params_.emplace_back(std::move(name), value);
    return value;
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
    for (const auto& [name, value] : params_) out.emplace_back(prefix + name, value);
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
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

void Module::to(Device device) {
    for (const Tensor& p : parameters()) {
        if (p.device() == device) continue;
        const Tensor moved = p.detach().to(device);
        TensorImpl& impl = p.impl();  // shared by every handle to this parameter
        impl.storage = moved.storage();
        impl.strides = moved.strides();
        impl.offset = moved.offset();
    }
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
