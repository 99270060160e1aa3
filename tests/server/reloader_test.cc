// The server's model reloading (server/reloader.h) on real tiny32 checkpoints and a real batcher,
// without gRPC, so that ThreadSanitizer checks the reload thread, the LATEST watch and the SIGHUP
// flag against the batcher's worker and concurrent callers (.ci/run's ThreadSanitizer stage).
// Asserts which model serves, what each reload returns, the reload counters, and that every
// prediction made during reloads is answered by one whole model with that model's values.
#include "server/reloader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/nn/checkpoint.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;
using std::chrono::milliseconds;

constexpr auto kTestTimeout = std::chrono::seconds(120);

// Points dir/LATEST at `name` atomically, as the trainer does: a watcher never reads half a name.
void WriteLatest(const std::string& dir, const std::string& name) {
  std::ofstream(dir + "/LATEST.tmp") << name << "\n";
  std::filesystem::rename(dir + "/LATEST.tmp", dir + "/LATEST");
}

class ReloaderTest : public ::testing::Test {
 protected:
  ReloaderTest() : batcher_(BatcherOpts(), &metrics_) {}

  static BatcherOptions BatcherOpts() {
    BatcherOptions o;
    o.max_batch = 2;
    return o;
  }

  std::unique_ptr<ModelReloader> MakeReloader(const std::string& checkpoint, milliseconds watch) {
    ReloaderOptions o;
    o.checkpoint = checkpoint;
    o.model.max_batch = 2;
    o.watch_interval = watch;
    return std::make_unique<ModelReloader>(o, &batcher_, &metrics_);
  }

  double Reloads(const std::string& result) {
    return MetricValue(metrics_.Serialize(), "cosmoflow_model_reloads_total",
                       "result=\"" + result + "\"");
  }

  // Waits until the batcher serves a model of checkpoint step `step`; false after kTestTimeout.
  bool WaitForStep(int64_t step) {
    const auto until = std::chrono::steady_clock::now() + kTestTimeout;
    while (std::chrono::steady_clock::now() < until) {
      auto m = batcher_.model();
      if (m && m->checkpoint().state.step == step) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  TempDir dir_{"reloader-test"};
  Metrics metrics_;
  Batcher batcher_;
};

TEST_F(ReloaderTest, InstallsTheLoadedModelAndKeepsTheWarmOneForTheSameCheckpoint) {
  const std::string a = WriteTinyCheckpoint(dir_ / "a.h5", 1, 10);
  const std::string b = WriteTinyCheckpoint(dir_ / "b.h5", 2, 20);
  auto reloader = MakeReloader(a, milliseconds(0));
  ASSERT_TRUE(reloader->LoadInitial().ok());
  ASSERT_TRUE(batcher_.model());
  EXPECT_EQ(batcher_.model()->checkpoint().state.step, 10);
  EXPECT_EQ(Reloads("success"), 0);  // the first load is not a reload

  bool changed = false;
  auto to_b = reloader->Reload(b, &changed);
  ASSERT_TRUE(to_b.ok()) << to_b.status().ToString();
  EXPECT_TRUE(changed);
  EXPECT_EQ(batcher_.model(), *to_b);
  EXPECT_EQ((*to_b)->checkpoint().state.step, 20);

  auto again = reloader->Reload(b, &changed);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(changed);
  EXPECT_EQ(*again, *to_b);  // not rebuilt
  EXPECT_EQ(Reloads("success"), 2);
  EXPECT_EQ(Reloads("failure"), 0);
}

TEST_F(ReloaderTest, ABadCheckpointLeavesTheServedModelAndCountsAFailure) {
  std::ofstream(dir_ / "junk.h5") << "junk";
  auto first = MakeReloader(dir_ / "junk.h5", milliseconds(0));
  Status s = first->LoadInitial();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir_ / "junk.h5"), std::string::npos) << s.message();
  EXPECT_FALSE(batcher_.model());
  EXPECT_EQ(Reloads("failure"), 0);  // nothing was served: not a failed reload
  first->Stop();

  const std::string a = WriteTinyCheckpoint(dir_ / "a.h5", 1, 10);
  auto reloader = MakeReloader(a, milliseconds(0));
  ASSERT_TRUE(reloader->LoadInitial().ok());
  auto served = batcher_.model();
  bool changed = true;
  auto bad = reloader->Reload(dir_ / "junk.h5", &changed);
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(changed);
  EXPECT_EQ(batcher_.model(), served);
  EXPECT_EQ(Reloads("failure"), 1);
}

TEST_F(ReloaderTest, FollowsLatestAndTriesABadCheckpointOnce) {
  ASSERT_TRUE(SaveCheckpointToDir(dir_.path(), MakeTinyCheckpoint(1, 100), 10).ok());
  auto reloader = MakeReloader(dir_.path(), milliseconds(50));
  ASSERT_TRUE(reloader->LoadInitial().ok());
  ASSERT_TRUE(SaveCheckpointToDir(dir_.path(), MakeTinyCheckpoint(2, 200), 10).ok());
  ASSERT_TRUE(WaitForStep(200));
  EXPECT_EQ(Reloads("success"), 1);

  // LATEST now names a corrupt file: the directory load falls back to the newest valid checkpoint
  // (step 200, already served), and the watch does not retry it every interval.
  std::ofstream(dir_ / "ckpt-000000300.h5") << "junk";
  WriteLatest(dir_.path(), "ckpt-000000300.h5");
  const auto until = std::chrono::steady_clock::now() + kTestTimeout;
  while (Reloads("success") + Reloads("failure") < 2 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(20));
  std::this_thread::sleep_for(milliseconds(500));  // 10 more intervals
  EXPECT_EQ(Reloads("success") + Reloads("failure"), 2);
  EXPECT_EQ(batcher_.model()->checkpoint().state.step, 200);
}

TEST_F(ReloaderTest, SighupReloadsWhenWatchingIsOff) {
  ASSERT_TRUE(SaveCheckpointToDir(dir_.path(), MakeTinyCheckpoint(1, 100), 10).ok());
  auto reloader = MakeReloader(dir_.path(), milliseconds(0));
  ASSERT_TRUE(reloader->LoadInitial().ok());
  ASSERT_TRUE(SaveCheckpointToDir(dir_.path(), MakeTinyCheckpoint(2, 200), 10).ok());
  std::this_thread::sleep_for(milliseconds(600));  // three polls of the SIGHUP flag
  EXPECT_EQ(batcher_.model()->checkpoint().state.step, 100);  // not watched
  reloader->RequestReload();
  EXPECT_TRUE(WaitForStep(200));
}

TEST_F(ReloaderTest, StopRunsQueuedReloadsAndRefusesLaterOnes) {
  const std::string a = WriteTinyCheckpoint(dir_ / "a.h5", 1, 10);
  const std::string b = WriteTinyCheckpoint(dir_ / "b.h5", 2, 20);
  auto reloader = MakeReloader(a, milliseconds(0));
  ASSERT_TRUE(reloader->LoadInitial().ok());
  std::mutex mu;
  std::vector<Status> results;
  auto record = [&](const StatusOr<std::shared_ptr<Model>>& m, bool) {
    std::lock_guard<std::mutex> lock(mu);
    results.push_back(m.status());
  };
  for (const std::string& p : {b, a, b}) reloader->ReloadAsync(p, record);
  reloader->Stop();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(results.size(), 3u);
    for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(batcher_.model()->checkpoint().state.step, 20);  // the last one queued

  reloader->ReloadAsync(a, record);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results.back().code(), StatusCode::kUnavailable);
  reloader->Stop();  // idempotent
}

// Every way of reloading at once while predictions flow: callers reloading two files, queued
// reloads, SIGHUP requests, and new checkpoints appearing under the watched directory. Each answer
// must come from one whole model: OK, with exactly that checkpoint's values for the cube.
TEST_F(ReloaderTest, ConcurrentReloadsNeverMixModelsOrFailAPrediction) {
  const std::string a = WriteTinyCheckpoint(dir_ / "a.h5", 1, 10);
  const std::string b = WriteTinyCheckpoint(dir_ / "b.h5", 2, 20);
  const std::string watched = dir_ / "run";
  std::filesystem::create_directory(watched);
  std::vector<std::string> dir_ckpts;
  for (int step : {100, 200, 300}) {
    auto path = SaveCheckpointToDir(watched, MakeTinyCheckpoint(step, step), 10);
    ASSERT_TRUE(path.ok());
    dir_ckpts.push_back(*path);
  }
  // LATEST back at the first: the watch sees the others appear one by one below.
  WriteLatest(watched, "ckpt-000000100.h5");
  const std::vector<int16_t> cube = RandomCounts(7, kVoxels);
  std::map<std::string, std::vector<double>> want;  // by checkpoint path
  for (const std::string& p : {a, b, dir_ckpts[0], dir_ckpts[1], dir_ckpts[2]})
    want[p] = EngineForward(p, cube);

  auto reloader = MakeReloader(watched, milliseconds(20));
  ASSERT_TRUE(reloader->LoadInitial().ok());

  std::atomic<bool> stop{false};
  std::atomic<int> answered{0}, failed{0}, mismatched{0};
  std::thread predictor([&] {
    while (!stop.load()) {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::vector<std::unique_ptr<InferenceRequest>> requests;
      auto r = std::make_unique<InferenceRequest>();
      r->cube.shape = {1, kSide, kSide, kSide};
      r->cube.dtype = DType::kInt16;
      r->cube.layout = AxisLayout::kChannelFirst;
      r->cube.data = cube.data();
      r->done = [&](const Status& s, InferenceResult&& result) {
        if (!s.ok() || !result.model) {
          failed.fetch_add(1);
        } else {
          const auto& expected = want.at(result.model->path());
          for (size_t k = 0; k < expected.size(); ++k)
            if (std::abs(result.values[k] - expected[k]) > 1e-5 * (1 + std::abs(expected[k])))
              mismatched.fetch_add(1);
        }
        answered.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        done = true;
        cv.notify_all();
      };
      requests.push_back(std::move(r));
      if (!batcher_.Submit(requests).ok()) {
        failed.fetch_add(1);
        continue;
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done; });
    }
  });
  std::atomic<int> async_done{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t)
    callers.emplace_back([&, t] {
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(reloader->Reload((i + t) % 2 ? a : b).ok());
        reloader->ReloadAsync(i % 2 ? b : a, [&](const StatusOr<std::shared_ptr<Model>>& m, bool) {
          EXPECT_TRUE(m.ok()) << m.status().ToString();
          async_done.fetch_add(1);
        });
        reloader->RequestReload();
      }
    });
  for (const char* name : {"ckpt-000000200.h5", "ckpt-000000300.h5"}) {
    std::this_thread::sleep_for(milliseconds(100));
    WriteLatest(watched, name);
  }
  for (auto& c : callers) c.join();
  reloader->Stop();
  stop.store(true);
  predictor.join();

  EXPECT_EQ(async_done.load(), 6);  // Stop ran every queued reload
  EXPECT_GT(answered.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(mismatched.load(), 0);
  EXPECT_EQ(Reloads("failure"), 0);
  EXPECT_GE(Reloads("success"), 12);  // 6 blocking + 6 queued, besides SIGHUP and LATEST ones
}

}  // namespace
}  // namespace cosmoflow
