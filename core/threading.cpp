#include "core/threading.h"

#include <cblas.h>
#include <omp.h>
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <malloc.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace qk {

namespace {
int current_threads = 1;
}

void enable_flush_to_zero() {
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}

void set_num_threads(int n) {
    QK_CHECK(n >= 1 && n <= kMaxThreads,
             "set_num_threads: the thread count must be in [1, {}], got {}", kMaxThreads, n);
    current_threads = n;
    omp_set_num_threads(n);
    // OpenBLAS stays on the calling thread: ops/matmul.cpp splits large GEMMs over our OpenMP
    // threads itself, so there is one pool of threads, and they sleep when idle.
    openblas_set_num_threads(1);
#pragma omp parallel num_threads(n)
    enable_flush_to_zero();  // each pool thread sets its own MXCSR
}

int num_threads() { return current_threads; }

int parse_thread_count(const std::string& text, const std::string& origin) {
    int n = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, n);
    QK_CHECK(ec == std::errc() && ptr == end && n >= 1 && n <= kMaxThreads,
             "{}: the thread count must be a whole number in [1, {}], got '{}'", origin,
             kMaxThreads, text);
    return n;
}

int available_cores() { return std::max(omp_get_num_procs(), 1); }

void init_threads() {
    static bool done = false;
    if (done) return;
    done = true;
    // This runs before main, where an exception would abort the program: a bad QK_NUM_THREADS is
    // reported and replaced by the default here, and programs that take a thread count (qknorm)
    // parse the variable again themselves to refuse it.
    int n = std::min(available_cores(), kMaxThreads);
    if (const char* env = std::getenv("QK_NUM_THREADS")) {
        try {
            n = parse_thread_count(env, "QK_NUM_THREADS");
        } catch (const Error& e) {
            std::fprintf(stderr, "qk: %s; using %d\n", e.what(), n);
        }
    }
    set_num_threads(n);
}

namespace {
// Runs at library load, so that every program gets the policy without asking for it.
struct ThreadingInit {
    ThreadingInit() {
        // glibc serves blocks over 32 MB with fresh mmap()s and unmaps them on free; each new page
        // then faults on first touch (~6 µs here), which made a 50 MB fill 40x slower than into a
        // reused buffer. Keep large blocks in the heap so activations of one step reuse the last's.
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        enable_flush_to_zero();
        init_threads();
    }
} threading_init;
}  // namespace

}  // namespace qk
