// CPU threading policy, in one place.
//
// One thread count, set_num_threads(n), serves every op. The default is the QK_NUM_THREADS
// environment variable, else every core the process may use: the default model trains 1.5x
// faster with 2 threads than with 1 on this 2-core machine when nothing else runs. OpenBLAS stays
// single-threaded and ops/matmul.cpp splits large GEMMs over our OpenMP threads, so that one pool
// of sleeping threads serves everything (OpenBLAS's own workers yield in a loop while they wait).
// Programs that run several processes at once (qknorm sweep --jobs N) give each a share.
//   * OpenMP threads should sleep when idle: the ./qk script exports OMP_WAIT_POLICY=passive
//     (libgomp reads it when it loads, before any code of ours could set it). Threads that spin
//     while waiting steal the core from the thread doing the work when the cores are shared.
//   * every thread computing runs with flush-to-zero and denormals-are-zero, because denormal
//     values (in Adam's second moment, for one) made a cpu training run ~10x slower.
// The thread count changes how row sums are split, so results are bit-identical only between
// runs with the same count.
#pragma once

#include <string>

namespace qk {

// More threads than this is a typo, not a request: each OpenMP thread takes a stack, and 100,000
// of them overflowed the process's memory inside libgomp.
constexpr int kMaxThreads = 1024;

void init_threads();          // idempotent; called by the library's static initialiser
void set_num_threads(int n);  // n in [1, kMaxThreads], else qk::Error
// A thread count written as text (QK_NUM_THREADS, --threads): a whole number in [1, kMaxThreads],
// else qk::Error naming `origin` and the text.
int parse_thread_count(const std::string& text, const std::string& origin);
int num_threads();
int available_cores();        // the cores this process may run on (its affinity mask)
void enable_flush_to_zero();  // for the calling thread

}  // namespace qk
