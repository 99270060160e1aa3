#include "trainer/signals.h"

#include <csignal>
#include <cstring>

namespace cosmoflow {
namespace {
volatile std::sig_atomic_t g_stop_signal = 0;

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
