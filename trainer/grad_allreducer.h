// Averages gradients over the ranks with MPI_Iallreduce on fused buckets, started from the
// network's Backward() on_grad_ready callback so that communication overlaps the rest of backward.
//
// Buckets: parameters are grouped in reverse order (the order in which backward finishes them)
// into contiguous fp32 fusion buffers of about `bucket_bytes` (25 MB by default, as Horovod and
// PyTorch DDP do: few enough messages to amortise latency, small enough to start early; and below
// glibc's 32 MB mmap threshold, whose page faults are slow in VMs). A bucket's allreduce starts as
// soon as its last gradient is copied in, in one of two ways:
// - kThread (default): a communication thread runs a blocking MPI_Allreduce per bucket while
//   backward continues (Horovod's design). OpenMPI has no asynchronous progress, so a nonblocking
//   collective advances only inside MPI calls; a thread that sits in MPI makes it advance. Needs
//   MPI_THREAD_SERIALIZED: the training thread makes no MPI call between BeginStep and FinishStep.
// - kNonblocking: MPI_Iallreduce, progressed by MPI_Test in every OnGradReady() callback; the
//   transfers advance only at those callbacks, so more of the communication is left exposed at
//   FinishStep (also the fallback when MPI lacks MPI_THREAD_SERIALIZED).
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

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/nn/network.h"

namespace cosmoflow {

inline constexpr int64_t kDefaultBucketBytes = 25 << 20;

class GradientAllreducer {
 public:
  enum class Mode { kThread, kNonblocking };
  // `params` must outlive the reducer (the network's parameters()).
  GradientAllreducer(std::vector<Parameter>* params, MPI_Comm comm, int64_t bucket_bytes,
                     Mode mode = Mode::kThread);
  ~GradientAllreducer();
  GradientAllreducer(const GradientAllreducer&) = delete;
  GradientAllreducer& operator=(const GradientAllreducer&) = delete;

  void BeginStep();
  void OnGradReady(int param_index);
  void FinishStep();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  int64_t total_bytes() const { return total_floats_ * 4; }
  // Seconds spent blocked in FinishStep() in the last step: the communication not hidden by
  // compute.
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
  void StartBucket(int k);
  void CommThread();

  std::vector<Parameter>* params_;
  MPI_Comm comm_;
  int world_size_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // parameter index -> bucket
  std::vector<int> slot_of_;    // parameter index -> position in its bucket
  std::vector<MPI_Request> in_flight_;
  int64_t total_floats_ = 0;
  int next_bucket_to_start_ = 0;
  double first_start_time_ = 0;
  double last_wait_seconds_ = 0;
  double last_span_seconds_ = 0;
  Mode mode_;
  // kThread: buckets handed to the communication thread, and how many it finished this step.
  std::thread comm_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int done_ = 0;
  bool stop_ = false;
};

}  // namespace cosmoflow
