#include "trainer/signals.h"

#include <atomic>
#include <csignal>
#include <cstring>

namespace cosmoflow {
namespace {
// An atomic, not a volatile sig_atomic_t: the handler may run on any thread of the process (the
// prefetch thread, the gradient thread, OpenMP workers) while the training thread reads the flag,
// and only a lock-free atomic is both async-signal-safe and free of a data race across threads.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");

extern "C" void OnStopSignal(int signo) { g_stop_signal = signo; }
}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool StopRequested() { return g_stop_signal != 0; }
int StopSignal() { return g_stop_signal; }
void ResetStopRequest() { g_stop_signal = 0; }

}  // namespace cosmoflow
