#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "core/strided.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace qk::autograd {

namespace {

// Every element's offset, in row-major order of the tensor's index space.
std::vector<int64_t> element_offsets(const Tensor& t) {
    std::vector<int64_t> offsets;
    const int64_t step = t.dim() ? t.strides().back() : 1;
    for_each_run<1>(t.shape(), {&t.strides()}, [&](const auto& off, int64_t n) {
        for (int64_t i = 0; i < n; ++i) offsets.push_back(off[0] + i * step);
    });
    return offsets;
}

double probe_loss(const std::function<Tensor()>& f, const Tensor& probe) {
    NoGradGuard no_grad;
    return sum(f() * probe).item();
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor()>& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options) {
    for (const Tensor& x : inputs) {
        QK_CHECK(x.dtype() == kF64 && x.requires_grad() && x.is_leaf(),
                 "gradcheck: inputs must be float64 leaves with requires_grad, got a {} tensor of "
                 "shape {}{}",
                 x.dtype(), x.shape(), x.requires_grad() ? "" : " without requires_grad");
        x.impl().grad.reset();
    }
    Generator gen(options.seed);
    Tensor out = f();
    Tensor probe = randn(out.shape(), kF64, gen);
    sum(out * probe).backward();

    GradcheckResult result;
    for (size_t k = 0; k < inputs.size(); ++k) {
        const Tensor& x = inputs[k];
        Tensor analytic = x.grad().defined() ? x.grad() : zeros(x.shape(), kF64);
        std::vector<double> analytic_values = analytic.to_vector<double>();
        double* data = static_cast<double*>(x.raw_data());
        std::vector<int64_t> offsets = element_offsets(x);
        double worst = -1;
        std::string worst_line;
        for (size_t j = 0; j < offsets.size(); ++j) {
            double& v = data[offsets[j]];
            const double saved = v;
            v = saved + options.eps;
            const double plus = probe_loss(f, probe);
            v = saved - options.eps;
            const double minus = probe_loss(f, probe);
            v = saved;
            const double numeric = (plus - minus) / (2 * options.eps);
            const double error = std::abs(analytic_values[j] - numeric);
            const double allowed = options.atol + options.rtol * std::abs(numeric);
            result.max_abs_error = std::max(result.max_abs_error, error);
            if (error > allowed) result.ok = false;
            if (error - allowed > worst) {
                worst = error - allowed;
                worst_line = fmt::format(
                    "input {} (shape {}), element {}: analytic {:.10g}, numeric "
                    "{:.10g}, |diff| {:.3g}, allowed {:.3g}\n",
                    k, x.shape(), j, analytic_values[j], numeric, error, allowed);
            }
        }
        result.report += worst_line;
    }
    return result;
}

}  // namespace qk::autograd
