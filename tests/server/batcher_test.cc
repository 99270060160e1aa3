// The dynamic batcher (server/batcher.h) on a real tiny32 model, without gRPC: batches fill up to
// max_batch, a lone request leaves after max_queue_delay (fixed mode) or at once (adaptive mode),
// an adaptive batch waits for the cubes being prepared, a full queue refuses all or nothing, and
// requests that must not be computed are answered with the reason. The tests assert batch sizes,
// statuses and counts; where a delay matters it is either far beyond the test's timeout (so only
// the behaviour under test can finish it) or checked as a lower bound, which load cannot break.
#include "server/batcher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "server/model.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;
using std::chrono::microseconds;

// Longer than any test may take: a batch that waits this long for company never leaves by itself.
constexpr microseconds kForever = std::chrono::hours(1);
constexpr auto kTestTimeout = std::chrono::seconds(60);

// What the batcher answered, in the order of the answers.
class Answers {
 public:
  struct Answer {
    int id;
    Status status;
    InferenceResult result;
  };

  std::function<void(const Status&, InferenceResult&&)> Callback(int id) {
    return [this, id](const Status& s, InferenceResult&& r) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        answers_.push_back({id, s, std::move(r)});
      }
      cv_.notify_all();
    };
  }
  // Waits (up to kTestTimeout) for n answers in all; false on timeout.
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kTestTimeout, [&] { return answers_.size() >= n; });
  }
  std::vector<Answer> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Answer> answers_;
};

class BatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpoint_ = WriteTinyCheckpoint(dir_ / "tiny.h5", 5);
    ModelOptions mo;
    mo.max_batch = 4;
    auto model = Model::Load(checkpoint_, mo);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = *model;
    for (int i = 0; i < 8; ++i) cubes_.push_back(RandomCounts(100 + i, kVoxels));
  }

  // Requests for cubes_[first .. first + n), answered into answers_ with their cube index as id.
  std::vector<std::unique_ptr<InferenceRequest>> Requests(int first, int n) {
    std::vector<std::unique_ptr<InferenceRequest>> requests;
    for (int i = first; i < first + n; ++i) {
      auto r = std::make_unique<InferenceRequest>();
      r->cube.shape = {1, kSide, kSide, kSide};
      r->cube.dtype = DType::kInt16;
      r->cube.layout = AxisLayout::kChannelFirst;
      r->cube.data = cubes_[i].data();
      r->done = answers_.Callback(i);
      requests.push_back(std::move(r));
    }
    return requests;
  }

  static BatcherOptions Options(bool adaptive, microseconds delay, int max_queue = 64) {
    BatcherOptions o;
    o.max_batch = 4;
    o.max_queue_delay = delay;
    o.max_queue = max_queue;
    o.adaptive = adaptive;
    return o;
  }

  // Every answer OK, with the engine's values for its cube and a batch of `batch_size`.
  void ExpectComputed(const std::vector<Answers::Answer>& answers, int batch_size) {
    for (const auto& a : answers) {
      ASSERT_TRUE(a.status.ok()) << a.id << ": " << a.status.ToString();
      EXPECT_EQ(a.result.batch_size, batch_size) << a.id;
      EXPECT_EQ(a.result.model.get(), model_.get());
      const std::vector<double> want = EngineForward(checkpoint_, cubes_[a.id]);
      ASSERT_EQ(a.result.values.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k)
        EXPECT_NEAR(a.result.values[k], want[k], 1e-5 * (1 + std::abs(want[k]))) << a.id;
    }
  }

  TempDir dir_{"batcher-test"};
  std::string checkpoint_;
  std::shared_ptr<Model> model_;
  std::vector<std::vector<int16_t>> cubes_;
  Answers answers_;
};

TEST_F(BatcherTest, BatchesFillUpToMaxBatch) {
  Metrics metrics;
  // Fixed mode and a long delay: only a full batch leaves by itself, and Stop() flushes the rest.
  Batcher batcher(Options(false, kForever), &metrics);
  batcher.SetModel(model_);
  auto requests = Requests(0, 6);
  ASSERT_TRUE(batcher.Submit(requests).ok());
  EXPECT_TRUE(requests.empty());  // the batcher owns them now
  ASSERT_TRUE(answers_.WaitFor(4));
  auto first = answers_.Get();
  ASSERT_EQ(first.size(), 4u);
  ExpectComputed(first, 4);
  // The oldest four, in queue order.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first[i].id, i);
  EXPECT_EQ(batcher.queue_depth(), 2);

  batcher.Stop();  // computes what is queued
  auto all = answers_.Get();
  ASSERT_EQ(all.size(), 6u);
  ExpectComputed({all.begin() + 4, all.end()}, 2);
  const std::string text = metrics.Serialize();
  EXPECT_EQ(MetricValue(text, "cosmoflow_batch_size_count"), 2);  // two forward passes
  EXPECT_EQ(MetricValue(text, "cosmoflow_predicted_cubes_total"), 6);
}

TEST_F(BatcherTest, FixedModeLoneRequestLeavesAloneAfterTheQueueDelay) {
  const microseconds delay = std::chrono::milliseconds(100);
  Batcher batcher(Options(false, delay), nullptr);
  batcher.SetModel(model_);
  auto requests = Requests(0, 1);
  ASSERT_TRUE(batcher.Submit(requests).ok());
  ASSERT_TRUE(answers_.WaitFor(1));
  auto answers = answers_.Get();
  ExpectComputed(answers, 1);
  // It waited for company for the whole delay (a lower bound: a loaded machine only adds to it).
  EXPECT_GE(answers[0].result.queue_seconds, 0.099);
}

TEST_F(BatcherTest, AdaptiveModeLoneRequestDoesNotWaitForCompany) {
  // The delay is longer than the test's timeout: only the adaptive flush can answer in time.
  Batcher batcher(Options(true, kForever), nullptr);
  batcher.SetModel(model_);
  for (int i = 0; i < 3; ++i) {
    auto requests = Requests(i, 1);
    ASSERT_TRUE(batcher.Submit(requests).ok());
    ASSERT_TRUE(answers_.WaitFor(i + 1)) << "request " << i << " waited for company";
  }
  ExpectComputed(answers_.Get(), 1);
}

TEST_F(BatcherTest, AdaptiveBatchWaitsForTheCubesBeingPrepared) {
  Batcher batcher(Options(true, kForever), nullptr);
  batcher.SetModel(model_);
  // Three handlers validate a cube each, then submit it and end their preparation, as the server's
  // do: the first cube must wait for the other two, and the three leave as one batch.
  for (int i = 0; i < 3; ++i) batcher.BeginPrepare();
  for (int i = 0; i < 3; ++i) {
    auto requests = Requests(i, 1);
    ASSERT_TRUE(batcher.Submit(requests).ok());
    batcher.EndPrepare();
    if (i < 2) {
      EXPECT_EQ(answers_.size(), 0u) << "a batch left before the prepared cubes joined";
    }
  }
  ASSERT_TRUE(answers_.WaitFor(3));
  auto answers = answers_.Get();
  ASSERT_EQ(answers.size(), 3u);
  ExpectComputed(answers, 3);
}

TEST_F(BatcherTest, FullQueueRefusesAllOrNothing) {
  Batcher batcher(Options(false, kForever, /*max_queue=*/3), nullptr);
  batcher.SetModel(model_);
  auto two = Requests(0, 2);
  ASSERT_TRUE(batcher.Submit(two).ok());
  EXPECT_EQ(batcher.queue_depth(), 2);
  auto another_two = Requests(2, 2);  // one slot left: neither is queued
  Status s = batcher.Submit(another_two);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("queue is full"), std::string::npos) << s.message();
  EXPECT_EQ(another_two.size(), 2u);  // still the caller's, to answer
  EXPECT_EQ(batcher.queue_depth(), 2);
  auto one = Requests(4, 1);
  ASSERT_TRUE(batcher.Submit(one).ok());
  EXPECT_EQ(batcher.queue_depth(), 3);

  batcher.Stop();
  auto answers = answers_.Get();
  ASSERT_EQ(answers.size(), 3u);  // the refused requests were never answered by the batcher
  ExpectComputed(answers, 3);
  auto late = Requests(5, 1);
  EXPECT_EQ(batcher.Submit(late).code(), StatusCode::kUnavailable);
}

// One connection cannot hold more than its share of the queue; another connection still gets in,
// and answered cubes free their connection's slots.
TEST_F(BatcherTest, PerConnectionLimitRefusesOnlyThatConnection) {
  BatcherOptions o = Options(false, kForever);
  o.max_inflight_per_connection = 2;
  Metrics metrics;
  Batcher batcher(o, &metrics);
  batcher.SetModel(model_);
  auto on = [](std::vector<std::unique_ptr<InferenceRequest>> requests, const char* connection) {
    for (auto& r : requests) r->connection = connection;
    return requests;
  };
  auto a = on(Requests(0, 2), "ipv4:10.0.0.1:5000");
  ASSERT_TRUE(batcher.Submit(a).ok());
  auto a_more = on(Requests(2, 1), "ipv4:10.0.0.1:5000");
  Status s = batcher.Submit(a_more);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("allows 2 per connection"), std::string::npos) << s.message();
  EXPECT_EQ(a_more.size(), 1u);  // refused: still the caller's
  auto b = on(Requests(3, 2), "ipv4:10.0.0.2:6000");
  ASSERT_TRUE(batcher.Submit(b).ok());  // another connection; the batch of 4 is now full
  ASSERT_TRUE(answers_.WaitFor(4));
  auto a_again = on(Requests(5, 2), "ipv4:10.0.0.1:5000");  // A's cubes answered: slots free
  ASSERT_TRUE(batcher.Submit(a_again).ok());
  auto unlabelled = Requests(7, 1);  // no connection: not counted
  ASSERT_TRUE(batcher.Submit(unlabelled).ok());
  EXPECT_NE(metrics.Serialize().find(
                "cosmoflow_limit_rejections_total{limit=\"inflight_per_connection\"} 1"),
            std::string::npos)
      << metrics.Serialize();
  batcher.Stop();
  ASSERT_EQ(answers_.size(), 7u);
  for (const auto& answer : answers_.Get()) EXPECT_TRUE(answer.status.ok()) << answer.id;
}

TEST_F(BatcherTest, RequestsThatMustNotBeComputedGetTheReason) {
  {
    Batcher batcher(Options(false, kForever), nullptr);
    batcher.SetModel(model_);
    auto requests = Requests(0, 3);
    requests[0]->deadline = std::chrono::system_clock::now() - std::chrono::seconds(1);
    requests[1]->cancelled = [] { return true; };
    ASSERT_TRUE(batcher.Submit(requests).ok());
    batcher.Stop();
  }
  {
    Batcher no_model(Options(false, kForever), nullptr);
    auto requests = Requests(3, 1);
    ASSERT_TRUE(no_model.Submit(requests).ok());
    ASSERT_TRUE(answers_.WaitFor(4));
  }
  auto answers = answers_.Get();
  ASSERT_EQ(answers.size(), 4u);
  EXPECT_EQ(answers[0].status.code(), StatusCode::kDeadlineExceeded)
      << answers[0].status.ToString();
  EXPECT_EQ(answers[1].status.code(), StatusCode::kCancelled) << answers[1].status.ToString();
  ExpectComputed({answers[2]}, 1);  // the only one computed, alone
  EXPECT_EQ(answers[3].status.code(), StatusCode::kUnavailable) << answers[3].status.ToString();
}

}  // namespace
}  // namespace cosmoflow
