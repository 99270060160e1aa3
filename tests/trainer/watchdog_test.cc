// CollectiveWatchdog (trainer/watchdog.h) in one process: the timeout scales with the slowest step,
// and a loop that keeps entering phases is never taken for a hang (if it were, the watchdog would
// abort this test process). Its thread is also run under ThreadSanitizer in CI. The abort itself is
// tested end to end (TrainerE2ETest.AFrozenRankMakesTheWatchdogAbortTheJob).
#include "trainer/watchdog.h"

#include <gtest/gtest.h>

#include <thread>

namespace cosmoflow {
namespace {

TEST(CollectiveWatchdogTest, TimeoutIsTheFloorOrTenSlowestSteps) {
  CollectiveWatchdog w(MPI_COMM_WORLD, 0, std::chrono::milliseconds(0));  // no thread
  EXPECT_EQ(w.timeout().count(), 0);
  CollectiveWatchdog v(MPI_COMM_WORLD, 0, std::chrono::milliseconds(2000));
  EXPECT_EQ(v.timeout().count(), 2000);
  v.StepTook(0.1);
  EXPECT_EQ(v.timeout().count(), 2000);  // 10 x 0.1 s < the floor
  v.StepTook(0.5);
  EXPECT_EQ(v.timeout().count(), 5000);
  v.StepTook(0.2);  // the slowest step counts
  EXPECT_EQ(v.timeout().count(), 5000);
}

TEST(CollectiveWatchdogTest, ProgressKeepsItQuiet) {
  CollectiveWatchdog w(MPI_COMM_WORLD, 0, std::chrono::milliseconds(150));
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
  for (int64_t step = 0; std::chrono::steady_clock::now() < end; ++step) {
    w.Enter("a phase", step);
    w.StepTook(0.001);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  SUCCEED();  // still alive after more than five timeouts of wall time
}

}  // namespace
}  // namespace cosmoflow
