// Per-connection limits on PredictStream calls: at most max_per_connection open streams per client
// connection (grpc::ServerContext::peer()), and a stream that has had nothing to do for
// idle_timeout (no message received, no cube in flight, no reply being written) is closed with
// RESOURCE_EXHAUSTED. Both are counted in cosmoflow_limit_rejections_total. (The in-flight cube
// limit per connection is the batcher's: BatcherOptions::max_inflight_per_connection.)
//
// Thread-safety: every method may be called from any thread. The reaper thread calls
// IdleStream::TryExpire with the registry's lock held and Finish-es the expired streams after
// releasing it; a stream must Unregister (in its OnDone) before it is destroyed.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "core/base/status.h"
#include "server/metrics.h"

namespace cosmoflow {

// What the registry needs of a stream.
class IdleStream {
 public:
  virtual ~IdleStream() = default;
  // If the stream has been idle since `idle_since` or earlier, marks it finished (so that no other
  // path finishes it) and returns true; the caller then calls FinishIdle exactly once.
  virtual bool TryExpire(std::chrono::steady_clock::time_point idle_since) = 0;
  virtual void FinishIdle(const grpc::Status& status) = 0;
};

class StreamLimits {
 public:
  // max_per_connection 0: no limit; idle_timeout 0: streams never expire (no reaper thread).
  StreamLimits(int max_per_connection, std::chrono::milliseconds idle_timeout, Metrics* metrics);
  ~StreamLimits();  // stops the reaper

  // Counts a new stream of `connection` and registers it for idle expiry; RESOURCE_EXHAUSTED
  // (naming the limit and its flag) when the connection already has max_per_connection open.
  Status Open(const std::string& connection, IdleStream* stream);
  // Undoes Open; call from the stream's OnDone, before deleting it.
  void Close(const std::string& connection, IdleStream* stream);

 private:
  void ReaperLoop();

  const int max_per_connection_;
  const std::chrono::milliseconds idle_timeout_;
  Metrics* metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> open_;  // streams by connection
  std::set<IdleStream*> streams_;
  bool stopping_ = false;
  std::thread reaper_;
};

}  // namespace cosmoflow
