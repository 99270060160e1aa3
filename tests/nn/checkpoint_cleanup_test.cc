// RemoveStaleTemporaryFiles: temporary files of dead writers go, those of live writers and every
// other file stay.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/nn/checkpoint.h"
#include "tests/common/files.h"

namespace cosmoflow {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// The pid of a process that has exited and been reaped (so kill(pid, 0) gives ESRCH).
pid_t DeadPid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

TEST(CheckpointCleanupTest, RemovesDeadWritersFilesAndKeepsLiveOnes) {
  TempDir dir("ckpt-cleanup");
  pid_t live = fork();  // a writer that is still running
  if (live == 0) {
    pause();
    _exit(0);
  }
  const pid_t dead = DeadPid();
  const std::string dead_ckpt = dir / ("ckpt-000000007.h5.tmp." + std::to_string(dead));
  const std::string dead_latest = dir / ("LATEST.tmp." + std::to_string(dead));
  const std::string live_ckpt = dir / ("ckpt-000000008.h5.tmp." + std::to_string(live));
  const std::string own = dir / ("ckpt-000000009.h5.tmp." + std::to_string(getpid()));
  const std::vector<std::string> others = {dir / "ckpt-000000007.h5", dir / "LATEST",
                                           dir / "ckpt-000000007.h5.tmp.12ab",
                                           dir / "notes.tmp.1", dir / "ckpt-1.h5.tmp.1"};
  for (const auto& p : {dead_ckpt, dead_latest, live_ckpt, own}) std::ofstream(p) << "partial";
  for (const auto& p : others) std::ofstream(p) << "keep";

  auto found = RemoveStaleTemporaryFiles(dir.path());
  kill(live, SIGKILL);
  waitpid(live, nullptr, 0);

  ASSERT_EQ(found.size(), 4u);
  EXPECT_FALSE(fs::exists(dead_ckpt));
  EXPECT_FALSE(fs::exists(dead_latest));
  EXPECT_TRUE(fs::exists(live_ckpt));
  EXPECT_TRUE(fs::exists(own));
  for (const auto& p : others) EXPECT_TRUE(fs::exists(p)) << p;
  for (const auto& f : found) {
    const bool is_dead = f.writer_pid == dead;
    EXPECT_EQ(f.removed, is_dead) << f.path;
    EXPECT_EQ(f.writer_alive, !is_dead) << f.path;
  }
  EXPECT_TRUE(RemoveStaleTemporaryFiles(dir / "no-such-dir").empty());
}

}  // namespace
}  // namespace cosmoflow
