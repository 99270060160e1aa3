#include "trainer/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace cosmoflow {

CollectiveWatchdog::CollectiveWatchdog(MPI_Comm comm, int rank, std::chrono::milliseconds floor,
                                       std::function<std::string()> diagnose)
    : comm_(comm), rank_(rank), floor_(floor), diagnose_(std::move(diagnose)) {
  if (floor_.count() > 0) thread_ = std::thread([this] { Loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::Enter(const char* phase, int64_t step) {
  phase_.store(phase, std::memory_order_relaxed);
  step_.store(step, std::memory_order_relaxed);
  beats_.fetch_add(1, std::memory_order_release);
}

void CollectiveWatchdog::StepTook(double seconds) {
  if (seconds > slowest_step_.load(std::memory_order_relaxed))
    slowest_step_.store(seconds, std::memory_order_relaxed);
}

std::chrono::milliseconds CollectiveWatchdog::timeout() const {
  const auto scaled = std::chrono::milliseconds(int64_t(10e3 * slowest_step_.load()));
  return std::max(floor_, scaled);
}

void CollectiveWatchdog::Loop() {
  using Clock = std::chrono::steady_clock;
  int64_t seen = beats_.load(std::memory_order_acquire);
  auto last_progress = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::min(floor_ / 4, std::chrono::milliseconds(1000)),
                 [this] { return stopping_; });
    const int64_t now_beats = beats_.load(std::memory_order_acquire);
    if (now_beats != seen) {
      seen = now_beats;
      last_progress = Clock::now();
      continue;
    }
    const auto stalled = Clock::now() - last_progress;
    if (stopping_ || stalled < timeout()) continue;
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    std::fprintf(stderr,
                 "cosmoflow-train: rank %d (%s): watchdog: no progress for %.0f s in %s at step "
                 "%lld (a rank is stopped, dead or cut off, or a collective is stuck): aborting "
                 "the job with exit code %d\n",
                 rank_, host, std::chrono::duration<double>(stalled).count(),
                 phase_.load(std::memory_order_relaxed),
                 static_cast<long long>(step_.load(std::memory_order_relaxed)), kWatchdogExitCode);
    std::fflush(stderr);
    if (diagnose_) {
      std::fprintf(stderr, "cosmoflow-train: rank %d (%s): watchdog: %s\n", rank_, host,
                   diagnose_().c_str());
      std::fflush(stderr);
    }
    MPI_Abort(comm_, kWatchdogExitCode);
    std::_Exit(kWatchdogExitCode);  // MPI_Abort does not return; if it ever did, still stop
  }
}

}  // namespace cosmoflow
