// Model (re)loading for the server, on a thread of its own: explicit reloads (the ReloadModel RPC,
// blocking or queued), SIGHUP requests, and the watch of a checkpoint directory's LATEST pointer
// (or an ensemble manifest's content). Every load is read, verified, built and warmed up off the
// serving path and then swapped into the batcher between batches; a load that fails leaves the
// served model as it was and counts a failed reload.
//
// Life cycle:
//   ModelReloader reloader(options, &batcher, &metrics);  // reload thread running, idle
//   reloader.LoadInitial();                               // first model; the watch starts after it
//   ... Reload() / ReloadAsync() / RequestReload() / LATEST changes ...
//   reloader.Stop();                                      // queued reloads run, the thread joins
//
// Thread-safety: every public method may be called from any thread; loads are serialised.
// Independent of gRPC, so that ThreadSanitizer can check it without an instrumented gRPC.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/base/status.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "server/model.h"

namespace cosmoflow {

struct ReloaderOptions {
  std::string checkpoint;  // a checkpoint file, a checkpoint directory or an ensemble manifest
  ModelOptions model;      // how every model is built
  // How often the thread polls the LATEST pointer (and the SIGHUP flag); 0 disables watching
  // (SIGHUP requests are then still served every 200 ms).
  std::chrono::milliseconds watch_interval{1000};
};

class ModelReloader {
 public:
  using Done = std::function<void(const StatusOr<std::shared_ptr<Model>>&, bool changed)>;

  // Starts the reload thread. `batcher` and `metrics` must outlive the reloader.
  ModelReloader(ReloaderOptions options, Batcher* batcher, Metrics* metrics);
  ~ModelReloader();  // Stop()

  // Loads options.checkpoint and installs it; from then on the thread watches LATEST. On failure
  // nothing is installed and the error says why.
  Status LoadInitial();

  // Loads `path` (empty: options.checkpoint, re-resolving LATEST) and installs it; blocks. A
  // model with the served one's version and path is not rebuilt (the served one is returned,
  // `changed` false). On failure the served model stays and the error says why.
  StatusOr<std::shared_ptr<Model>> Reload(const std::string& path, bool* changed = nullptr);
  // Reload() on the reload thread; `done` runs there with its result. After Stop() has begun,
  // `done` runs at once (on the caller) with UNAVAILABLE.
  void ReloadAsync(const std::string& path, Done done);
  // Asks the thread to reload options.checkpoint at its next poll. Async-signal-safe.
  void RequestReload() { reload_requested_.store(true); }

  // Runs the reloads already queued, then joins the thread. Idempotent.
  void Stop();

 private:
  void Loop();
  // One poll: a SIGHUP request, or a changed LATEST pointer.
  void WatchOnce();
  StatusOr<std::shared_ptr<Model>> ReloadLocked(const std::string& path, bool* changed);
  void Install(std::shared_ptr<Model> model);
  // What identifies the checkpoint options.checkpoint resolves to: the LATEST file's name in a
  // directory, an ensemble manifest's content, or "" for a single file.
  std::string ReadLatestPointer() const;

  const ReloaderOptions options_;
  Batcher* const batcher_;
  Metrics* const metrics_;

  std::mutex load_mu_;       // serialises loads; guards last_latest_
  std::string last_latest_;  // ReadLatestPointer() as of the last load of options.checkpoint
  std::atomic<bool> reload_requested_{false};

  std::mutex tasks_mu_;  // guards tasks_ and stopping_
  std::condition_variable tasks_cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::mutex join_mu_;  // guards thread_ (joined by Stop)
  std::thread thread_;
};

}  // namespace cosmoflow
