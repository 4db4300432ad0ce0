// The processes of one training job, and the collectives between them.
//
// Launched by `mpirun -np N` (or Slurm's `srun`), a program that calls dist::init() joins an MPI
// world of N ranks; started any other way, it is a world of one and every collective below
// returns at once with its input unchanged. Built without MPI (meson -Dmpi=disabled), the same
// API exists and the world is always one process.
//
// Every rank must call the same collectives in the same order (MPI's rule). Each one waits at
// most timeout() seconds: a rank that died or stopped answering makes the others print a clear
// error and end the whole job (MPI_Abort), instead of hanging in the collective forever. A rank
// that exits with an error does the same, so a failure on one rank never leaves the rest waiting.
//
// Tensors are reduced where they live: cpu tensors through MPI; device tensors through NCCL in a
// real CUDA build with NCCL (cuda/collectives.h), else through a host copy and MPI (the path the
// emulation build tests).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace qk::dist {

// Joins the MPI world when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK
// or PMI_RANK in the environment); otherwise, or without MPI, a world of one. Idempotent.
void init();
// Leaves the world (MPI_Finalize); also registered with atexit by init().
void finalize();
int rank();
int world_size();
inline bool is_root() { return rank() == 0; }
// True when this build can run several ranks (it was built with MPI).
bool built_with_mpi();

// True when all_reduce_sum sums device tensors on the device (NCCL), not through a host copy.
bool device_sums_in_place();

// Seconds a collective may wait for the other ranks before the job is ended (default 60).
double timeout();
void set_timeout(double seconds);

// Ends every rank of the job: prints "rank R: why" and calls MPI_Abort (or exits, alone).
[[noreturn]] void abort_job(const std::string& why);

// In place, on a contiguous float32/float64 tensor: every rank ends with the elementwise sum.
void all_reduce_sum(const Tensor& t);
double all_reduce_sum(double value);
double all_reduce_max(double value);
// In place, on a contiguous float32/float64 host tensor: every rank ends with the elementwise max.
void all_reduce_max(const Tensor& t);
// Root's tensor (contiguous, the same shape and dtype everywhere) copied into every rank's.
void broadcast(const Tensor& t, int root = 0);
// Every rank's string, in rank order, on every rank.
std::vector<std::string> all_gather(const std::string& value);

// ZeRO-1's halves of an all-reduce, on contiguous tensors whose numel is world_size() · shard:
// reduce_scatter_sum leaves in `shard` (numel shard) the sum over ranks of this rank's slice
// [rank · shard, (rank + 1) · shard) of `full`; all_gather_into fills `full` with every rank's
// `shard`, in rank order.
void reduce_scatter_sum(const Tensor& full, const Tensor& shard);
void all_gather_into(const Tensor& shard, const Tensor& full);

// A sum started now and finished by wait(): the gradient buckets of data-parallel training are
// reduced this way while the backward pass goes on. test() lets MPI make progress (Open MPI
// advances a non-blocking collective only inside MPI calls) and says whether it is done.
class PendingSum {
  public:
    PendingSum();
    PendingSum(PendingSum&&) noexcept;
    PendingSum& operator=(PendingSum&&) noexcept;
    ~PendingSum();
    bool test();
    void wait();  // at most timeout() seconds, then abort_job

    struct State;

  private:
    friend PendingSum all_reduce_sum_async(const Tensor& t);
    std::unique_ptr<State> state_;
};
// Starts an in-place sum of a contiguous cpu tensor, which must stay alive and untouched until
// wait() returns.
PendingSum all_reduce_sum_async(const Tensor& t);

}  // namespace qk::dist
