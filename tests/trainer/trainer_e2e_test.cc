// End-to-end tests of cosmoflow-train: real `mpirun -np 2` jobs on tiny HDF5 datasets, checked
// through the checkpoints, logs and exit codes they leave. Every run has a hard timeout, so a hang
// fails the test instead of blocking ctest.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/nn/checkpoint.h"
#include "core/nn/ensemble.h"
#include "core/nn/spec.h"
#include "core/nn/network.h"

namespace cosmoflow {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string err;
  double seconds = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) n += line.find(needle) != std::string::npos;
  return n;
}

class TrainerE2ETest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/cf-trainer-e2e-XXXXXX";
    data_ = ::mkdtemp(tmpl);
    // 32 training cubes of 32^3, 8 validation cubes, a 16^3 shard for the mismatch cases.
    Make(data_ + "/train.h5", 32, 32, 1);
    Make(data_ + "/val.h5", 8, 32, 2);
    Make(data_ + "/small16.h5", 8, 16, 3);
    // tiny32 without its dropout layer: the 2-rank / 1-rank comparison needs identical math,
    // and dropout masks depend on the rank (each rank sees different samples).
    auto spec = BuiltinSpec("tiny32");
    ASSERT_TRUE(spec.ok());
    std::vector<LayerSpec> layers;
    for (const auto& l : spec->layers)
      if (l.type != LayerType::kDropout) layers.push_back(l);
    spec->layers = layers;
    spec->name = "tiny32_nodrop";
    std::ofstream(data_ + "/nodrop.json") << spec->ToJson();
    // The same with batch_norm after conv1 + leaky ReLU (statistics across ranks).
    LayerSpec bn;
    bn.type = LayerType::kBatchNorm;
    spec->layers.insert(spec->layers.begin() + 5, bn);
    spec->name = "tiny32_nodrop_bn";
    ASSERT_TRUE(spec->Validate().ok()) << spec->Validate().ToString();
    std::ofstream(data_ + "/nodrop_bn.json") << spec->ToJson();
  }
  static void TearDownTestSuite() { std::system(("rm -rf '" + data_ + "'").c_str()); }

  void SetUp() override {
    char tmpl[] = "/tmp/cf-trainer-run-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    if (!HasFailure())
      std::system(("rm -rf '" + dir_ + "'").c_str());
    else
      std::fprintf(stderr, "kept %s for inspection\n", dir_.c_str());
  }

  static void Make(const std::string& path, int n, int side, int seed) {
    const std::string cmd = std::string(CF_MAKE_DATASET_BIN) + " " + path + " " +
                            std::to_string(n) + " " + std::to_string(side) + " " +
                            std::to_string(seed);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  static std::string Mpirun(int ranks) {
    return "env OMP_NUM_THREADS=1 " + std::string(CF_MPIRUN) +
           " --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np " +
           std::to_string(ranks) + " " + CF_TRAIN_BIN;
  }

  // Runs a command with a hard timeout; stderr is captured (stdout too, into the same file).
  RunResult Run(const std::string& cmd, int timeout_s = 90) {
    const std::string err = dir_ + "/stderr.txt";
    const std::string full =
        "timeout -k 5 " + std::to_string(timeout_s) + " sh -c '" + cmd + "' > " + err + " 2>&1";
    const auto t0 = std::chrono::steady_clock::now();
    const int status = std::system(full.c_str());
    RunResult r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.err = ReadFile(err);
    return r;
  }

  RunResult Train(int ranks, const std::string& out, const std::string& flags, int timeout_s = 90) {
    return Run(
        Mpirun(ranks) + " --train=" + data_ + "/train.h5 --out=" + out + " --log-every=1 " + flags,
        timeout_s);
  }

  static Checkpoint Latest(const std::string& out) {
    auto path = FindLatestCheckpoint(out + "/checkpoints");
    EXPECT_TRUE(path.ok()) << path.status().ToString();
    if (!path.ok()) return {};
    auto ck = ReadCheckpoint(*path);
    EXPECT_TRUE(ck.ok()) << ck.status().ToString();
    return ck.ok() ? *ck : Checkpoint{};
  }

  // Largest |a - b| relative to the largest |a| over all weights.
  static double RelativeDifference(const Checkpoint& a, const Checkpoint& b) {
    EXPECT_EQ(a.weights.size(), b.weights.size());
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < a.weights.size() && i < b.weights.size(); ++i) {
      EXPECT_EQ(a.weights[i].name, b.weights[i].name);
      for (size_t j = 0; j < a.weights[i].data.size(); ++j) {
        if (!std::isfinite(a.weights[i].data[j]) || !std::isfinite(b.weights[i].data[j]))
          return INFINITY;
        max_diff =
            std::max(max_diff, std::fabs(double(a.weights[i].data[j]) - b.weights[i].data[j]));
        max_abs = std::max(max_abs, std::fabs(double(a.weights[i].data[j])));
      }
    }
    return max_diff / std::max(max_abs, 1e-30);
  }

  static std::string data_;
  std::string dir_;
};
std::string TrainerE2ETest::data_;

// batch_norm end to end: its statistics span the ranks, so 2 ranks x batch 4 train the weights
// and running statistics of 1 rank x batch 8, and the checkpoint holds the running statistics.
TEST_F(TrainerE2ETest, BatchNormTwoRanksOfBatchBGiveTheWeightsOfOneRankOfBatch2B) {
  const std::string common =
      " --spec=" + data_ + "/nodrop_bn.json --epochs=2 --recipe=constant --lr=0.0003 --seed=3";
  RunResult two = Train(2, dir_ + "/two", "--batch=4" + common);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_NE(two.err.find("spec has batch_norm: using --allreduce=nonblocking"), std::string::npos) << two.err;
  RunResult one = Train(1, dir_ + "/one", "--batch=8" + common);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  Checkpoint a = Latest(dir_ + "/two"), b = Latest(dir_ + "/one");
  EXPECT_EQ(a.state.step, 8);
  EXPECT_LT(RelativeDifference(a, b), 1e-4);
  bool moved = false;
  for (const auto& t : a.weights) {
    if (t.name != "bn0.running_mean") continue;
    for (float v : t.data) moved = moved || v != 0.f;
  }
  EXPECT_TRUE(moved) << "bn0.running_mean missing from the checkpoint or never updated";
}

// --bn-statistics-batches: at each epoch end the running statistics become the population
// statistics of the epoch's batches, the same on 2 ranks x batch 4 as on 1 rank x batch 8, and not
// the momentum averages a run without the pass keeps.
TEST_F(TrainerE2ETest, BatchNormStatisticsPassIsTheSameOnAnyRanksAndReplacesTheMomentumAverages) {
  const std::string common =
      " --spec=" + data_ + "/nodrop_bn.json --epochs=2 --recipe=constant --lr=0.0003 --seed=3";
  RunResult two = Train(2, dir_ + "/two", "--batch=4 --bn-statistics-batches=9" + common);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_NE(two.err.find("batch_norm statistics from 4 batches of epoch 2"), std::string::npos) << two.err;
  RunResult one = Train(1, dir_ + "/one", "--batch=8 --bn-statistics-batches=4" + common);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  RunResult plain = Train(1, dir_ + "/plain", "--batch=8" + common);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  Checkpoint a = Latest(dir_ + "/two"), b = Latest(dir_ + "/one"), c = Latest(dir_ + "/plain");
  EXPECT_LT(RelativeDifference(a, b), 1e-4);
  const auto var = [](const Checkpoint& k) {
    for (const auto& t : k.weights) {
      if (t.name == "bn0.running_var") return t.data;
    }
    return std::vector<float>{};
  };
  ASSERT_FALSE(var(a).empty());
  double most = 0;
  for (size_t i = 0; i < var(a).size(); ++i) {
    EXPECT_NEAR(var(a)[i], var(b)[i], 1e-4 * std::abs(var(b)[i]) + 1e-7) << i;
    most = std::max(most, std::abs(double(var(a)[i]) - var(c)[i]) / std::abs(var(c)[i]));
  }
  EXPECT_GT(most, 1e-3) << "the pass left the momentum averages as they were";
}

TEST_F(TrainerE2ETest, TwoRanksOfBatchBGiveTheWeightsOfOneRankOfBatch2B) {
  const std::string common =
      " --spec=" + data_ + "/nodrop.json --epochs=2 --recipe=constant --lr=0.0003 --seed=3";
  RunResult two = Train(2, dir_ + "/two", "--batch=4" + common);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  RunResult one = Train(1, dir_ + "/one", "--batch=8" + common);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  RunResult other = Train(1, dir_ + "/other", "--batch=4" + common);  // other samples per step
  ASSERT_EQ(other.exit_code, 0) << other.err;
  Checkpoint a = Latest(dir_ + "/two"), b = Latest(dir_ + "/one"), c = Latest(dir_ + "/other");
  EXPECT_EQ(a.state.step, 8);  // 32 samples / global batch 8 x 2 epochs
  EXPECT_EQ(a.state.samples_seen, 64);
  EXPECT_EQ(a.provenance["ranks"], "2");
  const double same = RelativeDifference(a, b), different = RelativeDifference(a, c);
  EXPECT_LT(same, 1e-4) << "2 x 4 vs 1 x 8";
  EXPECT_GT(different, 100 * same)
      << "a run on other batches must differ (the comparison can fail)";
  EXPECT_GT(different, 1e-3);
}

TEST_F(TrainerE2ETest, ResumingAfterAStopGivesTheSameWeightsAsAnUninterruptedRun) {
  // tiny32 with dropout, Adam with linear decay (sc18 recipe), augmentation: every piece of state
  // (weights, moments, step, sampler position, dropout masks, symmetries) must be restored.
  const std::string common =
      " --spec=tiny32 --batch=2 --epochs=3 --recipe=sc18 --lr=0.003 --end-lr=0.0003 --augment "
      "--seed=11"
      " --deterministic --check-weights-every=1";
  RunResult full = Train(2, dir_ + "/full", common);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  RunResult part = Train(2, dir_ + "/cut", common + " --max-steps=13");
  ASSERT_EQ(part.exit_code, 0) << part.err;
  EXPECT_EQ(Latest(dir_ + "/cut").state.step, 13);
  RunResult rest = Train(2, dir_ + "/cut", common);
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_NE(rest.err.find("resumed from"), std::string::npos) << rest.err;
  EXPECT_NE(rest.err.find("at step 13"), std::string::npos) << rest.err;
  Checkpoint a = Latest(dir_ + "/full"), b = Latest(dir_ + "/cut");
  EXPECT_EQ(a.state.step, 24);
  EXPECT_EQ(b.state.step, 24);
  EXPECT_EQ(RelativeDifference(a, b), 0.0) << "resume must be exact";
  ASSERT_EQ(a.optimizer_state.size(), b.optimizer_state.size());
  for (size_t i = 0; i < a.optimizer_state.size(); ++i) {
    EXPECT_EQ(a.optimizer_state[i].data, b.optimizer_state[i].data) << a.optimizer_state[i].name;
  }
}

TEST_F(TrainerE2ETest, ACorruptLatestCheckpointFallsBackToThePreviousOne) {
  const std::string common =
      " --spec=tiny32 --batch=2 --recipe=constant --lr=0.01 --checkpoint-every=4";
  RunResult r =
      Train(2, dir_ + "/run", "--epochs=1" + common);  // steps 4, 8 -> checkpoints 4 and 8
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string latest = dir_ + "/run/checkpoints/ckpt-000000008.h5";
  ASSERT_TRUE(fs::exists(latest));
  {
    // Flip bytes in the middle of the file (the weights), keeping its size.
    std::fstream f(latest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(latest) / 2));
    const char junk[64] = {1, 2, 3, 4, 5, 6, 7, 8};
    f.write(junk, sizeof(junk));
  }
  RunResult again = Train(2, dir_ + "/run", "--epochs=2" + common);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("skipping checkpoint " + latest), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("ckpt-000000004.h5 at step 4"), std::string::npos) << again.err;
  EXPECT_EQ(Latest(dir_ + "/run").state.step, 16);
}

// Starts a job in the background and returns the pid of mpirun.
pid_t Spawn(const std::string& cmd, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string full = "exec " + cmd + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits up to `timeout_s` for `pid`; returns its exit code, or -1 on timeout (then kills it).
int WaitFor(pid_t pid, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> out;
  FILE* p = popen(("pgrep -P " + std::to_string(parent) + " cosmoflow-train").c_str(), "r");
  int pid = 0;
  while (p && std::fscanf(p, "%d", &pid) == 1) out.push_back(pid);
  if (p) pclose(p);
  return out;
}

bool WaitForFileContaining(const std::string& path, const std::string& needle, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    if (ReadFile(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST_F(TrainerE2ETest, Sigusr1OnOneRankCheckpointsAndExitsCleanlyOnBothRanks) {
  const std::string out = dir_ + "/run", log = dir_ + "/job.log";
  const pid_t job =
      Spawn(Mpirun(2) + " --train=" + data_ + "/train.h5 --out=" + out +
                " --spec=tiny32 --batch=2 --epochs=50 --log-every=1 --debug-step-sleep=0.05",
            log);
  ASSERT_TRUE(WaitForFileContaining(out + "/train_log.csv", "\ntrain,0,3,", 60)) << ReadFile(log);
  std::vector<pid_t> ranks = Children(job);
  ASSERT_EQ(ranks.size(), 2u) << "mpirun's children";
  kill(ranks.back(), SIGUSR1);  // one rank only: the others must learn it through the agreement
  const int code = WaitFor(job, 60);
  const std::string err = ReadFile(log);
  EXPECT_EQ(code, 75) << err;
  EXPECT_EQ(CountLines(err, "stop requested"), 2) << err;  // both ranks
  EXPECT_EQ(CountLines(err, "(signal 10 here)"), 1) << err;
  Checkpoint c = Latest(out);
  EXPECT_GE(c.state.step, 3);
  EXPECT_LT(c.state.step, 50 * 8);
  EXPECT_NE(ReadFile(out + "/run.json").find("\"outcome\": \"stopped\""), std::string::npos);
  // The requeued job continues from there.
  RunResult more = Train(2, out, "--spec=tiny32 --batch=2 --epochs=2");
  EXPECT_EQ(more.exit_code, 0) << more.err;
  EXPECT_NE(more.err.find("at step " + std::to_string(c.state.step)), std::string::npos)
      << more.err;
}

TEST_F(TrainerE2ETest, ARankThatDiesMakesTheJobFailPromptly) {
  RunResult r =
      Train(2, dir_ + "/run",
            "--spec=tiny32 --batch=2 --epochs=100 --debug-die-at-step=3 --debug-die-rank=1", 60);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.exit_code, 124) << "timed out instead of failing: " << r.err;
  EXPECT_LT(r.seconds, 30);
  EXPECT_NE(r.err.find("dying now"), std::string::npos) << r.err;
}

// A rank frozen with SIGSTOP leaves the others waiting in a collective: the watchdog of the one
// still running names the step and the phase and aborts the whole job with exit code 76, within
// the timeout plus a second or two, instead of hanging until the allocation ends.
TEST_F(TrainerE2ETest, AFrozenRankMakesTheWatchdogAbortTheJob) {
  const std::string out = dir_ + "/run", log = dir_ + "/job.log";
  const pid_t job = Spawn(Mpirun(2) + " --train=" + data_ + "/train.h5 --out=" + out +
                              " --spec=tiny32 --batch=2 --epochs=50 --log-every=1" +
                              " --debug-step-sleep=0.02 --watchdog-timeout-s=4",
                          log);
  ASSERT_TRUE(WaitForFileContaining(out + "/train_log.csv", "\ntrain,0,3,", 60)) << ReadFile(log);
  std::vector<pid_t> ranks = Children(job);
  ASSERT_EQ(ranks.size(), 2u) << "mpirun's children";
  const auto frozen_at = std::chrono::steady_clock::now();
  kill(ranks.back(), SIGSTOP);
  const int code = WaitFor(job, 60);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen_at).count();
  for (pid_t r : ranks) kill(r, SIGKILL);  // in case mpirun left the stopped one behind
  const std::string err = ReadFile(log);
  EXPECT_EQ(code, 76) << err;
  EXPECT_GE(seconds, 4) << err;
  EXPECT_LT(seconds, 20) << err;
  EXPECT_NE(err.find("watchdog: no progress for"), std::string::npos) << err;
  EXPECT_NE(err.find(" at step "), std::string::npos) << err;
  std::printf("frozen rank: the job ended %.1f s later with exit code %d\n", seconds, code);
}

TEST_F(TrainerE2ETest, KillDashNineDuringSavesNeverLeavesALoadableBrokenCheckpoint) {
  // One rank (the writer) checkpointing every step; SIGKILL at varying moments, repeatedly.
  const std::string out = dir_ + "/run";
  for (int round = 0; round < 8; ++round) {
    const std::string log = dir_ + "/job" + std::to_string(round) + ".log";
    const pid_t job = Spawn(
        Mpirun(1) + " --train=" + data_ + "/train.h5 --out=" + out +
            " --spec=tiny32 --batch=2 --epochs=100 --checkpoint-every=1 --keep-checkpoints=1000",
        log);
    ASSERT_TRUE(WaitForFileContaining(log, "checkpoint ", 60)) << ReadFile(log);
    // Spread the kills over the next several steps, each of which ends with a save.
    std::this_thread::sleep_for(std::chrono::milliseconds(97 * round + 13));
    const std::vector<pid_t> ranks = Children(job);
    EXPECT_EQ(ranks.size(), 1u) << "round " << round;
    for (pid_t rank : ranks) kill(rank, SIGKILL);
    EXPECT_NE(WaitFor(job, 30), -1);
  }
  int final_files = 0;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && e.path().extension() == ".h5") {
      ++final_files;
      auto ck = ReadCheckpoint(e.path().string());
      EXPECT_TRUE(ck.ok()) << name << ": " << ck.status().ToString();
    }
  }
  EXPECT_GE(final_files, 8);
  int leftovers = 0;  // temporary files of interrupted saves (timing-dependent, so only reported)
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) {
    leftovers += e.path().filename().string().find(".tmp") != std::string::npos;
  }
  std::fprintf(stderr, "%d checkpoints, %d temporary files left by kills during a save\n",
               final_files, leftovers);
  // A save cut short at any byte must not load even if it were under a final name: the reader's
  // verification (checksum, structure) is the second line of defence behind the rename.
  const std::string good = out + "/checkpoints/ckpt-000000001.h5";
  const std::string bytes = ReadFile(good);
  for (size_t cut : {bytes.size() / 3, bytes.size() / 2, bytes.size() - 100}) {
    const std::string broken = out + "/checkpoints/ckpt-900000000.h5";
    std::ofstream(broken, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(cut));
    EXPECT_FALSE(ReadCheckpoint(broken).ok()) << "truncated to " << cut << " bytes";
    auto chosen = FindLatestCheckpoint(out + "/checkpoints");
    ASSERT_TRUE(chosen.ok());
    EXPECT_NE(*chosen, broken);
    fs::remove(broken);
  }
  auto latest = FindLatestCheckpoint(out + "/checkpoints");
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  // LATEST names a complete checkpoint.
  std::string pointed = ReadFile(out + "/checkpoints/LATEST");
  pointed.erase(pointed.find_last_not_of("\n") + 1);
  EXPECT_TRUE(ReadCheckpoint(out + "/checkpoints/" + pointed).ok()) << pointed;
}

TEST_F(TrainerE2ETest, StartUpRemovesTemporaryFilesOfDeadWritersOnly) {
  const std::string ckpts = dir_ + "/run/checkpoints";
  fs::create_directories(ckpts);
  pid_t dead = fork();  // exits at once and is reaped: its pid names no process
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string stale = ckpts + "/ckpt-000000003.h5.tmp." + std::to_string(dead);
  const std::string live = ckpts + "/ckpt-000000004.h5.tmp." + std::to_string(getpid());
  std::ofstream(stale) << "an interrupted save";
  std::ofstream(live) << "a save in progress";
  RunResult r = Train(1, dir_ + "/run", "--spec=tiny32 --batch=2 --epochs=1 --max-steps=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(CountLines(r.err, "removed stale temporary checkpoint file " + stale), 1) << r.err;
  EXPECT_EQ(CountLines(r.err, "kept temporary checkpoint file " + live), 1) << r.err;
}

TEST_F(TrainerE2ETest, BadInputGivesOneClearLineAndANonZeroExit) {
  fs::create_directories(dir_ + "/empty");
  fs::create_directories(dir_ + "/mixed");
  fs::copy_file(data_ + "/train.h5", dir_ + "/mixed/a.h5");
  fs::copy_file(data_ + "/small16.h5", dir_ + "/mixed/b.h5");
  struct Case {
    std::string args;
    int code;
    std::string needle;
  } cases[] = {
      {"--train=/nonexistent/data.h5 --out=" + dir_ + "/o1 --spec=tiny32", 1,
       "/nonexistent/data.h5"},
      {"--train=" + dir_ + "/empty --out=" + dir_ + "/o2 --spec=tiny32", 1, dir_ + "/empty"},
      {"--train=" + dir_ + "/mixed --out=" + dir_ + "/o3 --spec=tiny32", 1, "b.h5"},
      {"--train=" + data_ + "/small16.h5 --out=" + dir_ + "/o4 --spec=tiny32", 1,
       "cubes are 1x16x16x16"},
      {"--train=" + data_ + "/train.h5 --out=" + dir_ + "/o5 --spec=nosuchmodel", 1, "nosuchmodel"},
      {"--train=" + data_ + "/train.h5 --out=" + dir_ + "/o6 --batch=banana", 2,
       "--batch=banana: not an integer"},
      {"--train=" + data_ + "/train.h5 --out=" + dir_ + "/o7 --spec=tiny32 --batch=64", 1,
       "fewer than one global batch"},
      {"--train=" + data_ + "/train.h5 --out=" + dir_ +
           "/o8 --spec=tiny32 --resume=/nonexistent.h5",
       1, "/nonexistent.h5"},
  };
  for (const auto& c : cases) {
    RunResult r = Run(Mpirun(2) + " " + c.args, 60);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_EQ(CountLines(r.err, "cosmoflow-train: error:"), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_LT(r.seconds, 30) << c.args;
  }
  if (!Bf16Supported()) {
    // bf16 on a CPU without AVX512-BF16/AMX: refused before the run directory is made.
    RunResult r = Run(Mpirun(2) + " --train=" + data_ + "/train.h5 --out=" + dir_ + "/o10 --spec=tiny32" +
                          " --precision=bf16",
                      60);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(CountLines(r.err, "cosmoflow-train: error:"), 1) << r.err;
    EXPECT_NE(r.err.find("AVX512-BF16"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir_ + "/o10"));
  }
  // A checkpoint of another model in the run directory is refused, not loaded.
  RunResult first =
      Train(2, dir_ + "/o9", "--spec=" + data_ + "/nodrop.json --batch=4 --max-steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  RunResult other = Train(2, dir_ + "/o9", "--spec=tiny32 --batch=4");
  EXPECT_EQ(other.exit_code, 1) << other.err;
  EXPECT_EQ(CountLines(other.err, "cosmoflow-train: error:"), 1) << other.err;
  EXPECT_NE(other.err.find("a different spec"), std::string::npos) << other.err;
}

TEST_F(TrainerE2ETest, ValidationWritesMetricsPredictionsAndPlots) {
  const std::string out = dir_ + "/run";
  RunResult r = Train(
      2, out,
      "--spec=tiny32 --batch=2 --epochs=2 --val=" + data_ + "/val.h5 --augment --stage=memory");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountLines(r.err, "validation epoch"), 2) << r.err;
  const std::string log = ReadFile(out + "/train_log.csv");
  EXPECT_EQ(
      log.rfind(
          "kind,epoch,step,samples_seen,lr,loss,mae,rel_err_Omega_M,rel_err_sigma_8,rel_err_n_s,",
          0),
      0u);
  EXPECT_EQ(CountLines(log, "val,"), 2);
  // 8 validation cubes split over 2 ranks, gathered and sorted on rank 0.
  const std::string pred = ReadFile(out + "/val_predictions.csv");
  EXPECT_EQ(CountLines(pred, ","), 9) << pred;
  EXPECT_EQ(
      pred.rfind("index,true_Omega_M,true_sigma_8,true_n_s,pred_Omega_M,pred_sigma_8,pred_n_s\n0,",
                 0),
      0u)
      << pred;
  const std::string summary = ReadFile(out + "/run.json");
  EXPECT_NE(summary.find("\"val_rel_err\""), std::string::npos) << summary;
  const std::string cmd = "/usr/bin/python3 " COSMOFLOW_SOURCE_DIR "/tools/plot_training.py " +
                          out + " > " + dir_ + "/plot.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadFile(dir_ + "/plot.txt");
  for (const char* png : {"/loss_curves.png", "/pred_vs_true.png"}) {
    const std::string bytes = ReadFile(out + png);
    ASSERT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(1, 3), "PNG") << png;
  }
}

TEST_F(TrainerE2ETest, StagingToALocalDirectoryWithShardShufflingTrains) {
  const std::string out = dir_ + "/run", stage = dir_ + "/local";
  RunResult r = Train(2, out,
                      "--spec=tiny32 --batch=2 --epochs=2 --shuffle=shard --stage=" + stage +
                          " --val=" + data_ + "/val.h5 --allreduce=nonblocking");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // One copy per node, made by local rank 0, under the stage directory; training read from it.
  EXPECT_TRUE(fs::exists(stage + "/cosmoflow-stage-train/train.h5"));
  EXPECT_TRUE(fs::exists(stage + "/cosmoflow-stage-val/val.h5"));
  EXPECT_EQ(fs::file_size(stage + "/cosmoflow-stage-train/train.h5"),
            fs::file_size(data_ + "/train.h5"));
  Checkpoint c = Latest(out);
  EXPECT_EQ(c.state.step, 16);  // 32 samples in 2 blocks of 16, batch 2 per rank, 2 epochs
  EXPECT_NE(ReadFile(out + "/run.json").find("\"allreduce\": \"nonblocking\""), std::string::npos);
  // A stage directory that cannot be created is bad input, not a crash.
  RunResult bad = Train(2, dir_ + "/run2", "--spec=tiny32 --batch=2 --stage=/proc/forbidden");
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_EQ(CountLines(bad.err, "cosmoflow-train: error:"), 1) << bad.err;
  EXPECT_NE(bad.err.find("--stage=/proc/forbidden"), std::string::npos) << bad.err;
}

// A deep ensemble of 3 members with a full-covariance head: each member is an ordinary run with its
// own seed and calibrated checkpoint; the manifest lists them with the mixture's calibration and
// loads as one model; running the command again resumes (nothing is retrained).
TEST_F(TrainerE2ETest, EnsembleWithUncertaintyHeadWritesACalibratedManifest) {
  ModelSpec spec = *BuiltinSpec("tiny32");
  spec.name = "tiny32_full";
  spec.uncertainty = UncertaintyHead::kGaussianFull;
  spec.layers.back().units = HeadWidth(spec.uncertainty, 3);
  std::ofstream(dir_ + "/full.json") << spec.ToJson();
  const std::string out = dir_ + "/ens";
  const std::string flags = "--spec=" + dir_ + "/full.json --val=" + data_ + "/val.h5 --epochs=2 --batch=4 " +
                            "--recipe=sc18 --members=3 --mse-warmup-epochs=1 --mean-gradient=mse --ensemble-prune-ratio=0";
  RunResult r = Train(2, out, flags, 240);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto e = LoadEnsemble(out + "/ensemble.json");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->members.size(), 3u);
  EXPECT_EQ(e->calibration.samples, 8);
  for (double f : e->calibration.sigma_scale) EXPECT_TRUE(f > 0 && std::isfinite(f)) << f;
  EXPECT_EQ(e->calibration.prior_low.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(e->members[k].state.rng_seed, uint64_t(1 + k)) << "member " << k << " seed";
    EXPECT_EQ(e->members[k].calibration.samples, 8) << "member " << k << " has its own calibration";
    EXPECT_EQ(e->members[k].spec.uncertainty, UncertaintyHead::kGaussianFull);
  }
  EXPECT_NE(e->members[0].weights[0].data, e->members[1].weights[0].data) << "members differ by seed";
  const std::string csv = ReadFile(out + "/val_predictions.csv");
  EXPECT_EQ(csv.rfind("index,true_Omega_M,true_sigma_8,true_n_s,pred_Omega_M,pred_sigma_8,pred_n_s,sigma_Omega_M", 0),
            0u)
      << csv;
  EXPECT_EQ(CountLines(csv, ","), 9) << "a header and the 8 validation cubes";

  const std::string manifest = ReadFile(out + "/ensemble.json");
  r = Train(2, out, flags, 240);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountLines(r.err, "resumed from"), 3) << r.err;
  EXPECT_EQ(ReadFile(out + "/ensemble.json"), manifest) << "resuming finished members changed the ensemble";

  r = Train(2, dir_ + "/bad", flags + " --resume=" + out + "/members/m0/checkpoints/ckpt-000000008.h5");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--resume="), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cosmoflow
