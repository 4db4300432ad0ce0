// Sums of device buffers over the ranks of a data-parallel job, through NCCL.
//
// Built only with real CUDA and MPI (meson: nccl found next to the CUDA toolkit); elsewhere
// core/distributed.cpp reduces device tensors through a host copy and MPI, which is the path the
// emulation build tests. The communicator is made on first use: rank 0's ncclUniqueId reaches
// the other ranks through `broadcast_id` (MPI), then ncclCommInitRank. Each sum runs on the
// communication stream, after the work already queued on the compute stream (an event) and
// before any work queued on it afterwards (the compute stream waits on a second event), and the
// host polls that event until the timeout, when the communicator is aborted and an Error thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace qk::cuda {

// True when this build sums device tensors with NCCL.
bool nccl_available();

// In place on every rank: data (count elements of dtype, device memory) becomes the sum over the
// ranks. Returns when the sum is done.
void nccl_all_reduce_sum(void* data, int64_t count, DType dtype, int rank, int ranks,
                         const std::function<void(void*, std::size_t)>& broadcast_id,
                         double timeout_seconds);

}  // namespace qk::cuda
