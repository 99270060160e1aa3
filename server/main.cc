// cosmoflow-server: serves a CosmoFlow checkpoint over gRPC (see docs/serving.md).
//
// Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT, in-flight requests drained), 2 bad flags,
// 3 cannot start (address in use, TLS files, metrics port), 4 the checkpoint cannot be served.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "core/base/flags.h"
#include "core/base/log.h"
#include "server/server.h"

namespace {

constexpr char kUsage[] = R"(usage: cosmoflow-server --checkpoint PATH [flags]
  --checkpoint PATH          checkpoint file, a directory (serves its LATEST, watched for changes), or an
                             ensemble manifest: a .json file or a directory holding ensemble.json (watched)
  --address HOST:PORT        gRPC address (default 0.0.0.0:8500; port 0 = pick a free one)
  --metrics-address HOST:PORT  Prometheus /metrics (default 0.0.0.0:9464; "" disables)
  --max-batch N              largest dynamic batch (default 4)
  --max-queue-delay-ms MS    longest wait for a batch to fill (default: auto, 10% of one forward pass)
  --max-queue N              queued cubes before RESOURCE_EXHAUSTED (default 64)
  --fixed-batch-wait         always wait up to the queue delay for a full batch (default: a batch
                             leaves once it holds as many cubes as were recently outstanding)
  --max-prepare-wait-ms MS   extra wait for cubes still being validated when a batch is due (default 50)
  --max-message-bytes N      gRPC message limit, both ways (default 67108864)
  --max-inflight-per-connection N  cubes one client connection may have queued or computing
                             (default: --max-queue); more get RESOURCE_EXHAUSTED
  --max-streams-per-connection N   open PredictStream calls per connection (default 16; 0 = no limit)
  --stream-idle-timeout-s S  close a stream with nothing to do for S seconds (default 300; 0 = never)
  --precision fp32|bf16      compute precision (default fp32)
  --kernel-selection rule|measure  conv kernels: the fixed rule (default), or time every candidate
                             at load and keep the fastest
  --kernel-cache FILE        measured timings, reused by later loads ("none": no file; default
                             $COSMOFLOW_KERNEL_CACHE, else ~/.cache/cosmoflow/kernel-timings.tsv)
  --watch-interval-ms MS     poll the checkpoint directory's LATEST (default 1000; 0 = off)
  --drain-timeout-s S        on SIGTERM, how long in-flight requests may take (default 30)
  --tls-cert PEM --tls-key PEM [--tls-client-ca PEM]   TLS (client certificates required with a CA)
  --enable-admin             accept ReloadModel (off by default), with at least one credential:
  --admin-token-file FILE    a bearer token (one line, >= 16 characters, not readable by others)
  --admin-client-cert-name NAME  a client certificate with this CN or SAN (needs --tls-client-ca)
  --admin-checkpoint-root DIR    ReloadModel may only name checkpoints under DIR (default: the
                             --checkpoint directory, or the directory holding the --checkpoint file)
  --port-file FILE           write the bound gRPC port there once listening
  --metrics-port-file FILE   write the bound metrics port there
Signals: SIGHUP reloads the checkpoint; SIGTERM/SIGINT drain and exit.
)";

bool WriteFile(const std::string& path, const std::string& text) {
  // Write-then-rename, so a watcher never reads a half-written port.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!(out << text << "\n")) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// What the command line asks for.
struct CommandLine {
  cosmoflow::ServerOptions options;
  std::chrono::milliseconds drain{30000};  // how long in-flight requests may take on SIGTERM
  std::optional<std::string> port_file, metrics_port_file;  // --port-file, --metrics-port-file
};

int UsageError(const std::string& message) {
  std::cerr << "cosmoflow-server: " << message << "\n" << kUsage;
  return 2;
}

// The --enable-admin and --admin-* flags; a combination that cannot work is a usage error.
cosmoflow::Status ParseAdminFlags(const cosmoflow::Flags& flags, cosmoflow::ServerOptions* options) {
  options->admin.enabled = flags.Has("enable-admin");
  options->admin.token_file = flags.Get("admin-token-file");
  options->admin.client_cert_name = flags.Get("admin-client-cert-name");
  options->admin.checkpoint_root = flags.Get("admin-checkpoint-root");
  return cosmoflow::CheckAdminOptions(options->admin, !options->tls_client_ca.empty());
}

// The per-connection limits; negative values are a usage error.
cosmoflow::Status ParseLimitFlags(const cosmoflow::Flags& flags, cosmoflow::ServerOptions* options) {
  auto inflight = flags.GetInt("max-inflight-per-connection", 0);
  auto streams = flags.GetInt("max-streams-per-connection", 16);
  auto idle_s = flags.GetDouble("stream-idle-timeout-s", 300);
  for (const cosmoflow::Status& s : {inflight.status(), streams.status(), idle_s.status()})
    if (!s.ok()) return s;
  if (*inflight < 0 || *streams < 0 || *idle_s < 0)
    return cosmoflow::InvalidArgumentError("per-connection limits must not be negative");
  options->max_inflight_per_connection = int(*inflight);
  options->max_streams_per_connection = int(*streams);
  options->stream_idle_timeout = std::chrono::milliseconds(int64_t(*idle_s * 1000));
  return cosmoflow::Status::Ok();
}

// Parses the flags into *cl. Returns the exit code when the program ends here (--help, bad flags).
std::optional<int> ParseCommandLine(int argc, char** argv, CommandLine* cl) {
  using namespace cosmoflow;
  Flags flags({{"checkpoint", true},
               {"address", true},
               {"metrics-address", true},
               {"max-batch", true},
               {"max-queue-delay-ms", true},
               {"max-queue", true},
               {"max-prepare-wait-ms", true},
               {"fixed-batch-wait", false},
               {"max-message-bytes", true},
               {"max-inflight-per-connection", true},
               {"max-streams-per-connection", true},
               {"stream-idle-timeout-s", true},
               {"precision", true},
               {"kernel-selection", true},
               {"kernel-cache", true},
               {"watch-interval-ms", true},
               {"drain-timeout-s", true},
               {"tls-cert", true},
               {"tls-key", true},
               {"tls-client-ca", true},
               {"enable-admin", false},
               {"admin-token-file", true},
               {"admin-client-cert-name", true},
               {"admin-checkpoint-root", true},
               {"port-file", true},
               {"metrics-port-file", true},
               {"help", false}});
  if (Status s = flags.Parse(argc, argv); !s.ok()) return UsageError(s.message());
  if (flags.Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (!flags.positional().empty())
    return UsageError("unexpected argument '" + flags.positional()[0] + "'");
  if (!flags.Has("checkpoint")) return UsageError("--checkpoint is required");

  ServerOptions& options = cl->options;
  options.checkpoint = flags.Get("checkpoint");
  options.address = flags.Get("address", "0.0.0.0:8500");
  options.metrics_address = flags.Get("metrics-address", "0.0.0.0:9464");
  options.tls_cert = flags.Get("tls-cert");
  options.tls_key = flags.Get("tls-key");
  options.tls_client_ca = flags.Get("tls-client-ca");
  if (Status s = ParseAdminFlags(flags, &options); !s.ok()) return UsageError(s.message());
  if (Status s = ParseLimitFlags(flags, &options); !s.ok()) return UsageError(s.message());
  auto max_batch = flags.GetInt("max-batch", 4);
  auto delay_ms = flags.GetDouble("max-queue-delay-ms", -1);
  auto max_queue = flags.GetInt("max-queue", 64);
  auto prepare_ms = flags.GetDouble("max-prepare-wait-ms", 50);
  auto max_message = flags.GetInt("max-message-bytes", 64 << 20);
  auto watch_ms = flags.GetInt("watch-interval-ms", 1000);
  auto drain_s = flags.GetDouble("drain-timeout-s", 30);
  auto precision = ParsePrecision(flags.Get("precision", "fp32"));
  auto selection = ParseKernelSelection(flags.Get("kernel-selection", "rule"));
  for (const Status& s :
       {max_batch.status(), delay_ms.status(), prepare_ms.status(), max_queue.status(),
        max_message.status(), watch_ms.status(), drain_s.status(), precision.status(),
        selection.status()})
    if (!s.ok()) return UsageError(s.message());
  if ((*delay_ms < 0 && flags.Has("max-queue-delay-ms")) || *prepare_ms < 0 || *watch_ms < 0 ||
      *drain_s < 0)
    return UsageError("durations must not be negative");
  options.max_batch = int(*max_batch);
  options.max_queue_delay = std::chrono::microseconds(int64_t(*delay_ms * 1000));
  options.max_queue = int(*max_queue);
  options.adaptive_batching = !flags.Has("fixed-batch-wait");
  options.max_prepare_wait = std::chrono::microseconds(int64_t(*prepare_ms * 1000));
  options.max_message_bytes = *max_message;
  options.watch_interval = std::chrono::milliseconds(*watch_ms);
  options.precision = *precision;
  options.kernel_selection = *selection;
  const std::string cache = flags.Get("kernel-cache", "");
  options.kernel_cache = cache == "none" ? "" : cache.empty() ? DefaultKernelCachePath() : cache;
  cl->drain = std::chrono::milliseconds(int64_t(*drain_s * 1000));
  if (flags.Has("port-file")) cl->port_file = flags.Get("port-file");
  if (flags.Has("metrics-port-file")) cl->metrics_port_file = flags.Get("metrics-port-file");
  return std::nullopt;
}

// The thread that waits for the signals (blocked in every other thread): SIGHUP reloads;
// SIGTERM/SIGINT drain and stop the server, and end the thread.
std::thread StartSignalThread(cosmoflow::InferenceServer* s, const sigset_t& signals,
                              std::chrono::milliseconds drain) {
  return std::thread([s, signals, drain] {
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (sig == SIGHUP) {
        s->RequestReload();
        continue;
      }
      CF_LOG(INFO) << "signal " << sig << ": draining in-flight requests (up to "
                   << drain.count() / 1000.0 << " s)";
      s->Shutdown(drain);
      return;
    }
  });
}

void WritePortFiles(const CommandLine& cl, const cosmoflow::InferenceServer& s) {
  if (cl.port_file && !WriteFile(*cl.port_file, std::to_string(s.port()))) {
    CF_LOG(WARNING) << "cannot write --port-file " << *cl.port_file;
  }
  if (cl.metrics_port_file && !WriteFile(*cl.metrics_port_file, std::to_string(s.metrics_port()))) {
    CF_LOG(WARNING) << "cannot write --metrics-port-file " << *cl.metrics_port_file;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cosmoflow;
  LimitMallocArenas();
  CommandLine cl;
  if (std::optional<int> code = ParseCommandLine(argc, argv, &cl)) return *code;

  // Signals go to one thread that waits for them (blocked everywhere else, including the threads
  // gRPC and OpenMP create later, which inherit this mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = InferenceServer::Start(cl.options);
  if (!server.ok()) {
    std::cerr << "cosmoflow-server: cannot start: " << server.status().message() << "\n";
    return 3;
  }
  InferenceServer* s = server->get();
  std::thread signal_thread = StartSignalThread(s, signals, cl.drain);
  WritePortFiles(cl, *s);

  int exit_code = 0;
  if (Status st = s->LoadInitialModel(); !st.ok()) {
    std::cerr << "cosmoflow-server: " << st.message() << "\n";
    exit_code = 4;
    kill(getpid(), SIGTERM);  // lets the signal thread shut down and return
  } else {
    CF_LOG(INFO) << "serving " << s->model()->version();
  }
  signal_thread.join();
  s->Wait();
  server->reset();
  return exit_code;
}
