#include "server/stream_limits.h"

#include <vector>

namespace cosmoflow {

StreamLimits::StreamLimits(int max_per_connection, std::chrono::milliseconds idle_timeout,
                           Metrics* metrics)
    : max_per_connection_(max_per_connection), idle_timeout_(idle_timeout), metrics_(metrics) {
  if (idle_timeout_.count() > 0) reaper_ = std::thread([this] { ReaperLoop(); });
}

StreamLimits::~StreamLimits() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

Status StreamLimits::Open(const std::string& connection, IdleStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  int& open = open_[connection];
  if (max_per_connection_ > 0 && open >= max_per_connection_) {
    if (open == 0) open_.erase(connection);
    if (metrics_) metrics_->RecordLimitRejection("streams_per_connection");
    return ResourceExhaustedError("this connection has " + std::to_string(open) +
                                  " open streams; the server allows " +
                                  std::to_string(max_per_connection_) +
                                  " per connection (--max-streams-per-connection)");
  }
  ++open;
  streams_.insert(stream);
  return Status::Ok();
}

void StreamLimits::Close(const std::string& connection, IdleStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
  auto it = open_.find(connection);
  if (it != open_.end() && --it->second <= 0) open_.erase(it);
}

void StreamLimits::ReaperLoop() {
  // Checks a few times per timeout, so a stream is closed at most ~1.25 timeouts after going idle.
  const auto period = std::max(idle_timeout_ / 4, std::chrono::milliseconds(10));
  const grpc::Status idle(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "the stream was idle for " + std::to_string(idle_timeout_.count()) +
                              " ms (--stream-idle-timeout-s); open a new one");
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, period, [this] { return stopping_; });
    const auto idle_since = std::chrono::steady_clock::now() - idle_timeout_;
    std::vector<IdleStream*> expired;
    for (IdleStream* s : streams_)
      if (s->TryExpire(idle_since)) expired.push_back(s);
    if (expired.empty()) continue;
    // Finished outside the lock: gRPC may run the stream's OnDone (which calls Close) inline. An
    // expired stream stays alive until FinishIdle, since OnDone follows Finish.
    lock.unlock();
    for (IdleStream* s : expired) {
      if (metrics_) metrics_->RecordLimitRejection("stream_idle");
      s->FinishIdle(idle);
    }
    lock.lock();
  }
}

}  // namespace cosmoflow
