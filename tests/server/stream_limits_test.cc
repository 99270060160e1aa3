// StreamLimits (server/stream_limits.h) without a server: the per-connection count, and the reaper
// thread expiring exactly the idle streams once each (also run under ThreadSanitizer in CI).
#include "server/stream_limits.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace cosmoflow {
namespace {

using Clock = std::chrono::steady_clock;

// A stream whose activity the test sets; counts how often it was finished.
class FakeStream : public IdleStream {
 public:
  bool TryExpire(Clock::time_point idle_since) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || busy_ || last_ > idle_since) return false;
    finished_ = true;
    return true;
  }
  void FinishIdle(const grpc::Status& status) override {
    code_ = status.error_code();
    finishes_.fetch_add(1);
  }
  void Touch() {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = Clock::now();
  }
  void SetBusy(bool busy) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = busy;
  }
  int finishes() const { return finishes_.load(); }
  grpc::StatusCode code() const { return code_.load(); }

 private:
  std::mutex mu_;
  bool finished_ = false, busy_ = false;
  Clock::time_point last_ = Clock::now();
  std::atomic<int> finishes_{0};
  std::atomic<grpc::StatusCode> code_{grpc::StatusCode::OK};
};

TEST(StreamLimitsTest, CountsStreamsPerConnection) {
  Metrics metrics;
  StreamLimits limits(2, std::chrono::milliseconds(0), &metrics);
  FakeStream a, b, c, d;
  ASSERT_TRUE(limits.Open("conn-1", &a).ok());
  ASSERT_TRUE(limits.Open("conn-1", &b).ok());
  Status third = limits.Open("conn-1", &c);
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("allows 2 per connection"), std::string::npos) << third.message();
  EXPECT_TRUE(limits.Open("conn-2", &d).ok());  // another connection
  limits.Close("conn-1", &a);
  EXPECT_TRUE(limits.Open("conn-1", &c).ok());  // a slot was freed
  for (auto* s : {&b, &c}) limits.Close("conn-1", s);
  limits.Close("conn-2", &d);
}

TEST(StreamLimitsTest, ReaperExpiresOnlyIdleStreamsOnce) {
  Metrics metrics;
  StreamLimits limits(0, std::chrono::milliseconds(100), &metrics);
  FakeStream idle, busy, active;
  busy.SetBusy(true);
  for (auto* s : {&idle, &busy, &active}) ASSERT_TRUE(limits.Open("c", s).ok());
  std::atomic<bool> stop{false};
  std::thread toucher([&] {  // keeps `active` active from another thread
    while (!stop.load()) {
      active.Touch();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  stop.store(true);
  toucher.join();
  EXPECT_EQ(idle.finishes(), 1);
  EXPECT_EQ(idle.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(busy.finishes(), 0);
  EXPECT_EQ(active.finishes(), 0);
  for (auto* s : {&idle, &busy, &active}) limits.Close("c", s);
}

}  // namespace
}  // namespace cosmoflow
