// gradcheck: compares autograd's gradients with central finite differences, in float64.
//
// The scalar checked is L(x) = sum(f(x) * r) with a fixed random probe r, not sum(f(x)): with a
// uniform upstream gradient whole terms of a backward vanish (softmax rows sum to one, a norm's
// mean term cancels), and a bug in them would pass unseen.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace qk::autograd {

struct GradcheckOptions {
    double eps = 1e-6;   // finite-difference step
    double atol = 1e-7;  // pass when |analytic - numeric| <= atol + rtol * |numeric|
    double rtol = 1e-5;
    uint64_t seed = 1234;  // for the probe r
};

struct GradcheckResult {
    bool ok = true;
    double max_abs_error = 0;
    std::string report;  // the worst element per input; printed by doctest on failure
    explicit operator bool() const { return ok; }
};

// `inputs` must be float64 leaves with requires_grad; f reads them and returns any tensor.
GradcheckResult gradcheck(const std::function<Tensor()>& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace qk::autograd

namespace qk {
using autograd::gradcheck;
}
