// The functions docs/tour.md's code exercises ask for (softplus, stops 6 and 11, is softplus.h):
// answers.cpp holds the solutions, scaffold/answers.cpp the blanks `./qk tour` hands a student.
#pragma once

#include "qk.h"

namespace tour {

// Stop 3: cube(x) = x³ as a hand-written autograd Node (save x, return 3x²·dy).
qk::Tensor cube(const qk::Tensor& x);
// Stop 5: a softmax whose backward subtracts mean(dy) instead of Σ_j dy_j y_j: right for a
// uniform dy, wrong otherwise.
qk::Tensor softmax_with_wrong_backward(const qk::Tensor& x);
// Stop 12: cosine attention, s = g · (q/‖q‖)·(k/‖k‖), causal, g one learnable scale per head.
qk::Tensor cosine_attention(const qk::Tensor& q, const qk::Tensor& k, const qk::Tensor& v,
                            const qk::Tensor& g, qk::AttentionSignals* signals = nullptr);

}  // namespace tour
