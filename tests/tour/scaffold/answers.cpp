// Your answers to docs/tour.md's code exercises (tests/tour/exercises.h declares them). Write
// each body, then `./qk tour` builds the tour's checks against this folder and runs them: a
// stop's test case passes once its answer is right. The tour's own solutions are in
// tests/tour/answers.cpp: compare after you have tried.
#include "exercises.h"

namespace tour {

using namespace qk;

// Stop 3: cube(x) = x³ as your own autograd::Node subclass: save x (detached), return 3x²·dy,
// and hook it up with autograd::attach the way tests/tour's stop 3 reading shows.
Tensor cube(const Tensor& x) {
    throw Error(
        fmt::format("stop 3: tour::cube is yours to write (tour/answers.cpp); x {}", x.shape()));
}

// Stop 5: a softmax whose backward subtracts mean(dy) over the last dim instead of Σ_j dy_j y_j
// (record it with autograd::record). The check shows sum(out) cannot tell, and gradcheck can.
Tensor softmax_with_wrong_backward(const Tensor& x) {
    throw Error(
        fmt::format("stop 5: tour::softmax_with_wrong_backward is yours to write "
                    "(tour/answers.cpp); x {}",
                    x.shape()));
}

// Stop 12: cosine attention from existing ops: normalise q and k (lp_normalize, p = 2), then
// the fused attention, causal, with g as its learnable per-head scale (AttentionOptions).
Tensor cosine_attention(const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                        AttentionSignals*) {
    throw Error(
        fmt::format("stop 12: tour::cosine_attention is yours to write "
                    "(tour/answers.cpp); q {}",
                    q.shape()));
}

}  // namespace tour
