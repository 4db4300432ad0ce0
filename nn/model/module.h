// Module: a tree of named parameters and sub-modules, like torch.nn.Module.
//
// Names are dotted paths built from the registration names, e.g.
// "transformer.h.0.attn.c_attn.weight", so checkpoints match nanoGPT's state_dict keys.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace qk::nn {

class Module {
  public:
    virtual ~Module() = default;

    // Every parameter below this module, depth first in registration order, with its dotted name.
    std::vector<std::pair<std::string, Tensor>> named_parameters() const;
    std::vector<Tensor> parameters() const;
    int64_t parameter_count() const;
    void zero_grad();
    // Moves every parameter to `device` in place: the tensor handles the modules hold (a tied
    // wte and LM head included) see the new storage. Create optimisers after moving.
    void to(Device device);
    Device device() const;  // where the parameters are (cpu for a module without any)

    void train(bool on = true);  // recursive; dropout and friends read training()
    void eval() { train(false); }
    bool training() const { return training_; }

  protected:
    Tensor register_parameter(std::string name, Tensor value);  // marks it requires_grad
    // A tensor the module computes with but does not train or save (a bf16 copy of a tied
    // head): it moves with the parameters in to(), and is in no checkpoint.
    Tensor register_buffer(Tensor value);
    std::vector<Tensor> buffers() const;  // this module's and its children's
    template <class M>
    std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
        children_.emplace_back(std::move(name), module);
        return module;
    }

  private:
    void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

    std::vector<std::pair<std::string, Tensor>> params_;
    std::vector<Tensor> buffers_;
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
    bool training_ = true;
};

// Stores parameter p as `dtype` in place, like Module::to for devices: every handle to it sees
// the new storage. The ops refuse to record a gradient for a bfloat16 one: it has no float32
// master copy to update (inference only).
void store_parameter_as(const Tensor& p, DType dtype);

}  // namespace qk::nn
