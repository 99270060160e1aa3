// The CosmoFlow inference server: gRPC service cosmoflow.v1.CosmoFlow (proto/cosmoflow.proto) and
// the KServe v2 protocol's inference.GRPCInferenceService (server/kserve.h) on the callback API, the dynamic batcher, model (re)loading, health, reflection, TLS and metrics.
//
// Life cycle:
//   auto server = InferenceServer::Start(options);  // listening; health NOT_SERVING
//   server->LoadInitialModel();                     // read, verify, build, warm up; SERVING
//   ... Reload() / RequestReload() / the checkpoint directory's LATEST pointer swap models ...
//   server->Shutdown(drain);                        // NOT_SERVING, finish in-flight, stop
// Predict calls before a model is loaded get UNAVAILABLE.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/base/status.h"
#include "core/nn/network.h"
#include "server/admin.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "server/model.h"
#include "server/reloader.h"

namespace cosmoflow {

struct ServerOptions {
  std::string address = "127.0.0.1:8500";  // host:port; port 0 picks a free one (see port())
  std::string metrics_address;             // host:port for /metrics; empty = no exposer
  std::string checkpoint;                  // a checkpoint file or a checkpoint directory
  int max_batch = 4;
  std::chrono::microseconds max_queue_delay{-1};  // negative: automatic (see BatcherOptions)
  int max_queue = 64;
  // Extra wait for requests still being validated when a batch is due (BatcherOptions).
  std::chrono::microseconds max_prepare_wait{50000};
  bool adaptive_batching = true;  // see BatcherOptions::adaptive
  // Per-connection limits (a connection is one client channel, grpc::ServerContext::peer()):
  // cubes queued or computing (0: as many as the queue holds), open PredictStream calls (0: no
  // limit), and how long a stream may sit with nothing to do before it is closed (0: forever).
  int max_inflight_per_connection = 0;
  int max_streams_per_connection = 16;
  std::chrono::milliseconds stream_idle_timeout{300000};
  // Largest message accepted and sent, both ways (gRPC's default of 4 MiB is below one 128^3
  // float32 cube). Larger requests get RESOURCE_EXHAUSTED from gRPC itself.
  int64_t max_message_bytes = 64 << 20;
  Precision precision = Precision::kFp32;
  // Conv kernels of every network the server builds (NetworkOptions::kernel_selection and
  // kernel_cache).
  KernelSelection kernel_selection = KernelSelection::kRule;
  std::string kernel_cache;
  // How often the reload thread polls a checkpoint directory's LATEST pointer (and the SIGHUP
  // flag); 0 disables directory watching.
  std::chrono::milliseconds watch_interval{1000};
  // TLS: PEM files. With cert and key the server speaks TLS only; with client_ca too, clients must
  // present a certificate signed by it.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // The admin RPCs (ReloadModel): off unless enabled with a credential (server/admin.h).
  AdminOptions admin;
};

class InferenceServer {
 public:
  // Binds the gRPC port (and the metrics port), starts the batcher and the reload thread. Errors:
  // unreadable TLS files, a port that cannot be bound, bad options.
  static StatusOr<std::unique_ptr<InferenceServer>> Start(const ServerOptions& options);
  ~InferenceServer();  // Shutdown(0)

  int port() const { return port_; }
  int metrics_port() const { return metrics_.exposer_port(); }
  Metrics& metrics() { return metrics_; }
  std::shared_ptr<Model> model() const { return batcher_->model(); }
  const ServerOptions& options() const { return options_; }

  // Loads options.checkpoint; on success the server reports SERVING. On failure it stays
  // NOT_SERVING and the error says why (the caller decides whether to exit).
  Status LoadInitialModel();

  // Loads `path` (empty: options.checkpoint, re-resolving LATEST) and swaps it in. On failure the
  // current model keeps serving and the error says why. Serialised with other reloads; blocks.
  // `changed` (optional) tells whether the served model changed.
  StatusOr<std::shared_ptr<Model>> Reload(const std::string& path, bool* changed = nullptr);
  // The same on the reload thread; `done` gets the result there.
  void ReloadAsync(const std::string& path, ModelReloader::Done done);
  // Asks the reload thread to reload options.checkpoint (what SIGHUP does). Async-signal-safe.
  void RequestReload() { reloader_->RequestReload(); }

  // Health NOT_SERVING; new RPCs still accepted for min(kHealthGrace, drain / 4), so that
  // health-checking clients move their next calls to other replicas without losing one already
  // sent; then refuse new RPCs, let in-flight ones finish until `drain` has passed (then cancel
  // them), stop the batcher and the reload thread. Idempotent.
  static constexpr std::chrono::milliseconds kHealthGrace{1000};
  void Shutdown(std::chrono::milliseconds drain);
  // Blocks until Shutdown() has finished.
  void Wait();

 private:
  class Service;
  explicit InferenceServer(const ServerOptions& options);
  void SetServing(bool serving);

  ServerOptions options_;
  AdminGuard admin_;  // set once in Start(), read-only afterwards
  Metrics metrics_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Service> kserve_service_;  // inference.GRPCInferenceService (kserve.h)
  std::atomic<bool> serving_{false};               // the health status, for the KServe readiness
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  std::unique_ptr<ModelReloader> reloader_;  // the reload thread (reloader.h)

  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shut_down_ = false;  // Shutdown() has started
  bool stopped_ = false;    // Shutdown() has finished
};

// Caps glibc's malloc at two arenas for the rest of the process, unless MALLOC_ARENA_MAX is set.
// Call first thing in main(), before any thread starts: it applies to arenas created later.
// Why: glibc gives each thread that allocates concurrently an arena of its own (up to 8 per core),
// and each keeps the 4-8 MiB cube buffers freed into it, so with gRPC's receiving threads spread
// over many arenas RSS keeps climbing under sustained load. With two arenas it stays flat, at the
// same throughput.
void LimitMallocArenas();

// gRPC and core status codes share numbers.
grpc::Status ToGrpcStatus(const Status& status);

}  // namespace cosmoflow
