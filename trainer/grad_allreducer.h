// Averages gradients over the ranks with MPI_Iallreduce on fused buckets, started from the
// network's Backward() on_grad_ready callback so that communication overlaps the rest of backward.
//
// Buckets: parameters are grouped in reverse order (the order in which backward finishes them)
// into contiguous fp32 fusion buffers of about `bucket_bytes` (25 MB by default, as Horovod and
// PyTorch DDP do: few enough messages to amortise latency, small enough to start early). A bucket's
// Iallreduce starts as soon as its last gradient is copied in. Because OpenMPI has no asynchronous
// progress thread, every OnGradReady() also calls MPI_Testall on the buckets in flight, which lets
// the transfers advance while backward computes.
//
// Usage per step (one thread, the one that calls MPI):
//   reducer.BeginStep();
//   net.Backward(diff, [&](int i) { reducer.OnGradReady(i); });
//   reducer.FinishStep();   // waits, writes grad = sum / world_size back into every parameter
// Contract: every rank has the same parameter list (same spec) and calls these in the same order;
// each OnGradReady(i) is called exactly once per step for every i. With one rank nothing is sent
// and FinishStep() leaves the gradients untouched.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "core/nn/network.h"

namespace cosmoflow {

inline constexpr int64_t kDefaultBucketBytes = 25 << 20;

class GradientAllreducer {
 public:
  // `params` must outlive the reducer (the network's parameters()).
  GradientAllreducer(std::vector<Parameter>* params, MPI_Comm comm, int64_t bucket_bytes);
  ~GradientAllreducer();
  GradientAllreducer(const GradientAllreducer&) = delete;
  GradientAllreducer& operator=(const GradientAllreducer&) = delete;

  void BeginStep();
  void OnGradReady(int param_index);
  void FinishStep();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  int64_t total_bytes() const { return total_floats_ * 4; }
  // Seconds spent blocked in FinishStep() in the last step: the communication not hidden by compute.
  double last_wait_seconds() const { return last_wait_seconds_; }
  // Seconds from the first bucket's start to the last bucket's completion (overlapped or not).
  double last_comm_span_seconds() const { return last_span_seconds_; }

 private:
  struct Bucket {
    std::vector<int> params;      // indices into *params_, in reverse (ready) order
    std::vector<int64_t> offset;  // offset of each parameter in `buffer`
    std::vector<float> buffer;
    int pending = 0;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  void Progress();

  std::vector<Parameter>* params_;
  MPI_Comm comm_;
  int world_size_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;      // parameter index -> bucket
  std::vector<int> slot_of_;        // parameter index -> position in its bucket
  std::vector<MPI_Request> in_flight_;
  int64_t total_floats_ = 0;
  int next_bucket_to_start_ = 0;
  double first_start_time_ = 0;
  double last_wait_seconds_ = 0;
  double last_span_seconds_ = 0;
};

}  // namespace cosmoflow
