// NCCL behind cuda/collectives.h (real CUDA builds with MPI only).
#include "cuda/collectives.h"

#include <nccl.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "cuda/runtime.h"

namespace qk::cuda {

namespace {

struct Communicator {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;  // the communication stream
    cudaEvent_t queued = nullptr;   // the compute stream's work before the sum
    cudaEvent_t done = nullptr;     // the sum itself
};
Communicator communicator;

void check_nccl(ncclResult_t result, const char* call) {
    if (result == ncclSuccess) return;
    throw Error(fmt::format("NCCL: {} failed: {}", call, ncclGetErrorString(result)));
}

ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
        case DType::f32:
            return ncclFloat32;
        case DType::f64:
            return ncclFloat64;
        default:
            break;
    }
    throw Error(fmt::format("nccl_all_reduce_sum: needs float32 or float64 data, got {}", dtype));
}

void make_communicator(int rank, int ranks,
                       const std::function<void(void*, std::size_t)>& broadcast_id) {
    ncclUniqueId id{};
    if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    broadcast_id(&id, sizeof id);
    check_nccl(ncclCommInitRank(&communicator.comm, ranks, id, rank), "ncclCommInitRank");
    // Non-blocking: no implicit ordering with the legacy default stream, only the events'.
    QK_CUDA_CHECK(cudaStreamCreateWithFlags(&communicator.stream, cudaStreamNonBlocking));
    QK_CUDA_CHECK(cudaEventCreateWithFlags(&communicator.queued, cudaEventDisableTiming));
    QK_CUDA_CHECK(cudaEventCreateWithFlags(&communicator.done, cudaEventDisableTiming));
}

}  // namespace

bool nccl_available() { return true; }

void nccl_all_reduce_sum(void* data, int64_t count, DType dtype, int rank, int ranks,
                         const std::function<void(void*, std::size_t)>& broadcast_id,
                         double timeout_seconds) {
    if (!communicator.comm) make_communicator(rank, ranks, broadcast_id);
    Communicator& c = communicator;
    QK_CUDA_CHECK(cudaEventRecord(c.queued, stream()));
    QK_CUDA_CHECK(cudaStreamWaitEvent(c.stream, c.queued, 0));
    check_nccl(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dtype), ncclSum,
                             c.comm, c.stream),
               "ncclAllReduce");
    QK_CUDA_CHECK(cudaEventRecord(c.done, c.stream));
    QK_CUDA_CHECK(cudaStreamWaitEvent(stream(), c.done, 0));
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (;;) {
        const cudaError_t state = cudaEventQuery(c.done);
        if (state == cudaSuccess) return;
        if (state != cudaErrorNotReady) QK_CUDA_CHECK(state);
        const double waited = std::chrono::duration<double>(clock::now() - start).count();
        if (waited > timeout_seconds) {
            ncclCommAbort(c.comm);  // frees the ranks still inside the collective
            c.comm = nullptr;
            throw Error(fmt::format(
                "ncclAllReduce waited {:.0f} s for the other ranks (--dist-timeout): a rank died "
                "or stopped answering",
                waited));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

}  // namespace qk::cuda
