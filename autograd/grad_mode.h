// Grad mode: whether ops record autograd nodes. On by default; NoGradGuard turns it off in a scope
// (evaluation, optimizer updates, and the backward pass itself). Per thread, like PyTorch.
#pragma once

namespace qk::autograd {

bool grad_enabled();
void set_grad_enabled(bool on);

class NoGradGuard {
  public:
    NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
    ~NoGradGuard() { set_grad_enabled(previous_); }
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

  private:
    bool previous_;
};

}  // namespace qk::autograd

namespace qk {
using autograd::NoGradGuard;
}
