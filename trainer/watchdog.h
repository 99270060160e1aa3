// Collective watchdog: a hung collective must not burn the allocation. If the training loop makes
// no progress for the timeout (a rank stopped with SIGSTOP, a node whose link is cut, a deadlock),
// every rank that can still run its watchdog logs what it was waiting in and at which step, and
// the job is aborted with kWatchdogExitCode (MPI_Abort on the world communicator), as NCCL's and
// PyTorch's watchdogs do, instead of waiting forever.
//
// The timeout is max(floor, 10 x the slowest training step measured so far), so a slow network on
// slow nodes is not aborted for being slow. The training loop reports each phase as it enters it
// (Enter); any Enter is progress. floor 0 disables the watchdog (no thread).
//
// Thread-safety: Enter and StepTook from the training thread; the watchdog has its own thread.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace cosmoflow {

inline constexpr int kWatchdogExitCode = 76;

class CollectiveWatchdog {
 public:
  // `diagnose`, if given, runs on the watchdog's thread when it fires (no MPI calls: the training
  // thread may sit in one) and its line is logged before the abort, e.g. PeerProbe::Describe.
  CollectiveWatchdog(MPI_Comm comm, int rank, std::chrono::milliseconds floor,
                     std::function<std::string()> diagnose = nullptr);
  ~CollectiveWatchdog();  // stops the thread
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The loop now does `phase` (a string literal) of step `step`.
  void Enter(const char* phase, int64_t step);
  // One training step took `seconds` (scales the timeout).
  void StepTook(double seconds);
  // The timeout in effect now.
  std::chrono::milliseconds timeout() const;

 private:
  void Loop();

  const MPI_Comm comm_;
  const int rank_;
  const std::chrono::milliseconds floor_;
  const std::function<std::string()> diagnose_;
  std::atomic<int64_t> beats_{0};
  std::atomic<int64_t> step_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::atomic<double> slowest_step_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cosmoflow
