// MPI behind core/distributed.h. Every collective is started non-blocking and then polled
// (MPI_Test) until done or until the timeout: that poll loop is what turns a dead or frozen rank
// into an error on the others, where a blocking MPI call would wait forever.
#include "core/distributed.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#ifdef QK_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's deprecated C++ bindings warn
#include <mpi.h>
#endif

#include "core/error.h"
#ifdef QK_WITH_NCCL
#include "cuda/collectives.h"
#endif

namespace qk::dist {

namespace {

double timeout_seconds = 60;

#ifdef QK_WITH_MPI
bool mpi_started = false;
int my_rank = 0, ranks = 1;

bool launched_by_mpi() {
    for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
        if (std::getenv(variable)) return true;
    return false;
}

void check_mpi(int code, const char* what) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    abort_job(fmt::format("{} failed: {}", what, std::string(text, length)));
}

MPI_Datatype mpi_type(DType dtype, const char* op) {
    switch (dtype) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::f64:
            return MPI_DOUBLE;
        default:
            break;
    }
    throw Error(fmt::format("{}: needs a float32 or float64 tensor, got {}", op, dtype));
}

// Polls until the request completes; past the timeout the job ends. The first millisecond spins
// (a small reduction finishes in microseconds), then each poll sleeps 50 µs so that a rank waiting
// for a slower one leaves the core to the threads that still compute.
void wait_for(MPI_Request& request, const char* what) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (int flag = 0;;) {
        check_mpi(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
        if (flag) return;
        const double waited = std::chrono::duration<double>(clock::now() - start).count();
        if (waited > timeout_seconds)
            abort_job(fmt::format(
                "{} waited {:.0f} s for the other ranks (--dist-timeout): a rank died or stopped "
                "answering",
                what, waited));
        if (waited > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

// The contiguous cpu tensor that MPI reads and writes for t: t itself, or a host copy of a
// device tensor (copied back by finish_host()).
Tensor host_view(const Tensor& t, const char* op) {
    QK_CHECK(t.defined() && t.is_contiguous(), "{}: needs a defined contiguous tensor, got {}", op,
             t.defined() ? fmt::format("strides {}", t.strides()) : std::string("undefined"));
    return t.device() == Device::cpu ? t : t.to(Device::cpu);
}
void finish_host(const Tensor& t, const Tensor& host) {
    if (!host.same(t)) copy_into(t, host);
}
#endif

}  // namespace

bool device_sums_in_place() {
#ifdef QK_WITH_NCCL
    return true;
#else
    return false;
#endif
}

double timeout() { return timeout_seconds; }
void set_timeout(double seconds) {
    QK_CHECK(seconds > 0, "dist: the timeout must be > 0 seconds, got {}", seconds);
    timeout_seconds = seconds;
}

#ifdef QK_WITH_MPI

bool built_with_mpi() { return true; }

void init() {
    if (mpi_started || !launched_by_mpi()) return;
    int provided = 0;
    // FUNNELED: only the main thread calls MPI; the pool's workers never do.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init");
    mpi_started = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    std::atexit(finalize);
}

void finalize() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi_started && !finalized) MPI_Finalize();
}

int rank() { return my_rank; }
int world_size() { return ranks; }

void abort_job(const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nrank %d of %d: %s\n", my_rank, ranks, why.c_str());
    std::fflush(stderr);
    if (mpi_started && ranks > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
}

namespace {
// In place over MPI, through a host copy of a device tensor: every rank ends with op of them all.
void all_reduce_through_host(const Tensor& t, MPI_Op op, const char* what) {
    Tensor host = host_view(t, what);
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, host.raw_data(), static_cast<int>(host.numel()),
                             mpi_type(t.dtype(), what), op, MPI_COMM_WORLD, &request),
              what);
    wait_for(request, what);
    finish_host(t, host);
}
}  // namespace

void all_reduce_sum(const Tensor& t) {
    if (ranks == 1) return;
#ifdef QK_WITH_NCCL
    if (t.device() == Device::cuda) {  // NCCL, device to device; MPI only carries its id
        QK_CHECK(t.is_contiguous(), "all_reduce_sum: needs a contiguous tensor, got strides {}",
                 t.strides());
        auto broadcast_id = [](void* bytes, std::size_t n) {
            MPI_Request request;
            check_mpi(MPI_Ibcast(bytes, static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD, &request),
                      "broadcast of the NCCL id");
            wait_for(request, "broadcast of the NCCL id");
        };
        cuda::nccl_all_reduce_sum(t.raw_data(), t.numel(), t.dtype(), my_rank, ranks, broadcast_id,
                                  timeout_seconds);
        return;
    }
#endif
    all_reduce_through_host(t, MPI_SUM, "all_reduce_sum");
}

namespace {
double reduce_scalar(double value, MPI_Op op, const char* what) {
    if (ranks == 1) return value;
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, op, MPI_COMM_WORLD, &request),
              what);
    wait_for(request, what);
    return value;
}
}  // namespace

double all_reduce_sum(double value) { return reduce_scalar(value, MPI_SUM, "all_reduce_sum"); }
double all_reduce_max(double value) { return reduce_scalar(value, MPI_MAX, "all_reduce_max"); }

void all_reduce_max(const Tensor& t) {
    if (ranks == 1) return;
    all_reduce_through_host(t, MPI_MAX, "all_reduce_max");
}

void broadcast(const Tensor& t, int root) {
    if (ranks == 1) return;
    Tensor host = host_view(t, "broadcast");
    MPI_Request request;
    check_mpi(MPI_Ibcast(host.raw_data(), static_cast<int>(host.numel()),
                         mpi_type(t.dtype(), "broadcast"), root, MPI_COMM_WORLD, &request),
              "broadcast");
    wait_for(request, "broadcast");
    finish_host(t, host);
    mark_written(t);
}

std::vector<std::string> all_gather(const std::string& value) {
    if (ranks == 1) return {value};
    std::vector<int> lengths(ranks), offsets(ranks);
    int length = static_cast<int>(value.size());
    MPI_Request request;
    check_mpi(
        MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD, &request),
        "all_gather");
    wait_for(request, "all_gather");
    int total = 0;
    for (int r = 0; r < ranks; ++r) offsets[r] = total, total += lengths[r];
    std::string joined(static_cast<size_t>(total), '\0');
    check_mpi(MPI_Iallgatherv(value.data(), length, MPI_CHAR, joined.data(), lengths.data(),
                              offsets.data(), MPI_CHAR, MPI_COMM_WORLD, &request),
              "all_gather");
    wait_for(request, "all_gather");
    std::vector<std::string> values;
    for (int r = 0; r < ranks; ++r) values.push_back(joined.substr(offsets[r], lengths[r]));
    return values;
}

namespace {
void check_sharding(const Tensor& full, const Tensor& shard, const char* op) {
    QK_CHECK(full.dtype() == shard.dtype() && full.numel() == shard.numel() * ranks,
             "{}: the full tensor ({} {}) must hold {} shards like ({} {})", op, full.dtype(),
             full.shape(), ranks, shard.dtype(), shard.shape());
}
}  // namespace

void reduce_scatter_sum(const Tensor& full, const Tensor& shard) {
    check_sharding(full, shard, "reduce_scatter_sum");
    if (ranks == 1) return copy_into(shard, full.reshape(shard.shape()));
    Tensor host_full = host_view(full, "reduce_scatter_sum");
    Tensor host_shard = host_view(shard, "reduce_scatter_sum");
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter_block(
                  host_full.raw_data(), host_shard.raw_data(), static_cast<int>(shard.numel()),
                  mpi_type(full.dtype(), "reduce_scatter_sum"), MPI_SUM, MPI_COMM_WORLD, &request),
              "reduce_scatter_sum");
    wait_for(request, "reduce_scatter_sum");
    finish_host(shard, host_shard);
}

void all_gather_into(const Tensor& shard, const Tensor& full) {
    check_sharding(full, shard, "all_gather_into");
    if (ranks == 1) return copy_into(full, shard.reshape(full.shape()));
    Tensor host_full = host_view(full, "all_gather_into");
    Tensor host_shard = host_view(shard, "all_gather_into");
    const MPI_Datatype type = mpi_type(full.dtype(), "all_gather_into");
    const int count = static_cast<int>(shard.numel());
    MPI_Request request;
    check_mpi(MPI_Iallgather(host_shard.raw_data(), count, type, host_full.raw_data(), count, type,
                             MPI_COMM_WORLD, &request),
              "all_gather_into");
    wait_for(request, "all_gather_into");
    finish_host(full, host_full);
}

struct PendingSum::State {
    MPI_Request request = MPI_REQUEST_NULL;
    Tensor tensor;
    bool done = false;
};

PendingSum all_reduce_sum_async(const Tensor& t) {
    PendingSum pending;
    pending.state_ = std::make_unique<PendingSum::State>();
    pending.state_->tensor = t;
    QK_CHECK(t.device() == Device::cpu && t.is_contiguous(),
             "all_reduce_sum_async: needs a contiguous cpu tensor, got one on {} with strides {}",
             t.device(), t.strides());
    if (ranks == 1) {
        pending.state_->done = true;
        return pending;
    }
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(t.numel()),
                             mpi_type(t.dtype(), "all_reduce_sum_async"), MPI_SUM, MPI_COMM_WORLD,
                             &pending.state_->request),
              "all_reduce_sum_async");
    return pending;
}

bool PendingSum::test() {
    if (!state_ || state_->done) return true;
    int flag = 0;
    check_mpi(MPI_Test(&state_->request, &flag, MPI_STATUS_IGNORE), "all_reduce_sum_async");
    state_->done = flag != 0;
    return state_->done;
}

void PendingSum::wait() {
    if (!state_ || state_->done) return;
    wait_for(state_->request, "a gradient bucket's all-reduce");
    state_->done = true;
}

#else  // a world of one

bool built_with_mpi() { return false; }
void init() {}
void finalize() {}
int rank() { return 0; }
int world_size() { return 1; }
void abort_job(const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "\n%s\n", why.c_str());
    std::_Exit(1);
}
void all_reduce_sum(const Tensor&) {}
double all_reduce_sum(double value) { return value; }
double all_reduce_max(double value) { return value; }
void all_reduce_max(const Tensor&) {}
void broadcast(const Tensor&, int) {}
std::vector<std::string> all_gather(const std::string& value) { return {value}; }
void reduce_scatter_sum(const Tensor& full, const Tensor& shard) {
    QK_CHECK(full.numel() == shard.numel(), "reduce_scatter_sum: one rank: full {} vs shard {}",
             full.shape(), shard.shape());
    copy_into(shard, full.reshape(shard.shape()));
}
void all_gather_into(const Tensor& shard, const Tensor& full) {
    QK_CHECK(full.numel() == shard.numel(), "all_gather_into: one rank: shard {} vs full {}",
             shard.shape(), full.shape());
    copy_into(full, shard.reshape(full.shape()));
}
struct PendingSum::State {};
PendingSum all_reduce_sum_async(const Tensor&) { return {}; }
bool PendingSum::test() { return true; }
void PendingSum::wait() {}

#endif

PendingSum::PendingSum() = default;
PendingSum::PendingSum(PendingSum&&) noexcept = default;
PendingSum& PendingSum::operator=(PendingSum&&) noexcept = default;
PendingSum::~PendingSum() {
    // A sum still in flight writes into its tensor: finish it before the tensor can go away.
    if (state_) wait();
}

}  // namespace qk::dist
