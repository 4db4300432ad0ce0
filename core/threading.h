// CPU threading policy, in one place.
//
// On this kind of machine (2 virtual cores that share about one physical core under load),
// threads that spin while waiting for work steal the core from the thread doing it. The policy:
//   * OpenMP threads should sleep when idle: the ./qk script exports OMP_WAIT_POLICY=passive
//     (libgomp reads it when it loads, before any code of ours could set it);
//   * OpenBLAS and our OpenMP kernels share one thread count, set_num_threads(n) (default: the
//     QK_NUM_THREADS environment variable, else 1, the fastest measured setting here);
//   * every thread computing runs with flush-to-zero and denormals-are-zero, because denormal
//     values (in Adam's second moment, for one) made a cpu training run ~10x slower.
#pragma once

namespace qk {

void init_threads();  // idempotent; called by the library's static initialiser
void set_num_threads(int n);
int num_threads();
void enable_flush_to_zero();  // for the calling thread

}  // namespace qk
