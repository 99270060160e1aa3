#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/base/log.h"
#include "proto/cosmoflow.grpc.pb.h"
#include "server/kserve.h"
#include "server/stream_limits.h"
#include "server/validate.h"

namespace cosmoflow {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      status.message());
}

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

const char* CodeName(grpc::StatusCode code) {
  return StatusCodeName(static_cast<StatusCode>(static_cast<int>(code)));
}

void FillModelInfo(const Model& model, const ServerOptions& options, v1::ModelInfo* info) {
  const ModelSpec& spec = model.spec();
  const Checkpoint& ckpt = model.checkpoint();
  info->set_version(model.version());
  info->set_checksum(model.checksum());
  info->set_spec_name(spec.name);
  info->set_spec_json(spec.ToJson());
  info->add_input_shape(spec.input_channels);
  for (int i = 0; i < 3; ++i) info->add_input_shape(spec.input_side);
  info->add_accepted_dtypes(v1::DTYPE_INT16);
  info->add_accepted_dtypes(v1::DTYPE_FLOAT32);
  info->set_input_transform(InputTransformName(spec.input_transform));
  for (const auto& o : spec.outputs) {
    auto* out = info->add_outputs();
    out->set_name(o.name);
    out->set_unit(o.unit);
    out->set_offset(o.offset);
    out->set_scale(o.scale);
  }
  info->set_num_parameters(spec.NumParameters());
  info->set_step(ckpt.state.step);
  info->set_epoch(ckpt.state.epoch);
  for (const auto& [k, v] : ckpt.provenance) (*info->mutable_provenance())[k] = v;
  info->set_checkpoint_path(model.path());
  info->set_loaded_at_unix_seconds(model.loaded_at_unix_seconds());
  info->set_load_seconds(model.load_seconds());
  info->set_max_batch(model.options().max_batch);
  info->set_max_message_bytes(options.max_message_bytes);
  info->set_precision(PrecisionName(model.options().precision));
  info->set_uncertainty(model.uncertainty_method());
  info->set_uncertainty_head(UncertaintyHeadName(spec.uncertainty));
  info->set_ensemble_members(model.ensemble_members());
  const Calibration& c = model.calibration();
  for (double f : c.sigma_scale) info->add_calibration(f);
  info->set_calibration_samples(c.samples);
  for (double b : c.sigma_exponent) info->add_calibration_exponent(b);
  for (double r : c.sigma_reference) info->add_calibration_reference(r);
  for (double e : c.sigma_edge) info->add_calibration_edge(e);
  for (double v : c.prior_low) info->add_prior_low(v);
  for (double v : c.prior_high) info->add_prior_high(v);
  if (model.is_ensemble())
    for (const auto& m : model.member_paths()) info->add_member_checkpoints(m);
}

void FillResponse(const std::string& request_id, const InferenceResult& r, Clock::time_point start,
                  v1::PredictResponse* resp) {
  resp->set_request_id(request_id);
  const auto& outputs = r.model->spec().outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto* p = resp->add_parameters();
    p->set_name(outputs[i].name);
    p->set_unit(outputs[i].unit);
    p->set_value(r.values[i]);
    // Only a model with an uncertainty sets sigma: absent, not 0, says "unknown".
    if (!r.covariance.empty()) p->set_sigma(std::sqrt(r.covariance[i * outputs.size() + i]));
  }
  for (double v : r.covariance) resp->add_covariance(v);
  resp->set_model_version(r.model->version());
  auto* t = resp->mutable_timings();
  t->set_queue_seconds(r.queue_seconds);
  t->set_compute_seconds(r.compute_seconds);
  t->set_total_seconds(SecondsSince(start));
  t->set_batch_size(r.batch_size);
}

}  // namespace

// ---- the service ----


class InferenceServer::Service final : public v1::CosmoFlow::CallbackService {
 public:
  explicit Service(InferenceServer* server)
      : server_(server),
        stream_limits_(server->options_.max_streams_per_connection,
                       server->options_.stream_idle_timeout, &server->metrics_) {}

  // Validates one request into a batcher entry (the batcher transforms it into the network's input
  // when its batch runs). `request` must outlive `done`.
  StatusOr<std::unique_ptr<InferenceRequest>> Prepare(const v1::PredictRequest& request,
                                                      const std::string& field,
                                                      grpc::CallbackServerContext* ctx) {
    server_->metrics_.AddReceivedBytes(double(request.cube().data().size()));
    std::shared_ptr<Model> model = server_->batcher_->model();
    if (!model) return UnavailableError("no model is loaded yet (the server is starting)");
    if (!request.model_version().empty() && request.model_version() != model->version())
      return FailedPreconditionError(field + ".model_version is '" + request.model_version() +
                                     "' but the server runs '" + model->version() + "'");
    const ModelSpec& spec = model->spec();
    CF_ASSIGN_OR_RETURN(
        CubeView view,
        ValidateCube(request.cube(), {spec.input_channels, spec.input_side}, field + ".cube"));
    auto item = std::make_unique<InferenceRequest>();
    item->cube = view;
    if (ctx) {
      item->connection = ctx->peer();
      item->deadline = ctx->deadline();
      item->cancelled = [ctx] { return ctx->IsCancelled(); };
    }
    return item;
  }

  void Record(const char* method, const grpc::Status& status, Clock::time_point start) {
    server_->metrics_.RecordRequest(method, CodeName(status.error_code()), SecondsSince(start));
  }

  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* ctx,
                                    const v1::PredictRequest* request,
                                    v1::PredictResponse* response) override {
    const auto start = Clock::now();
    auto* reactor = ctx->DefaultReactor();
    auto finish = [this, reactor, start](const grpc::Status& s) {
      Record("Predict", s, start);
      reactor->Finish(s);
    };
    PrepareScope preparing(server_->batcher_.get());
    auto item = Prepare(*request, "request", ctx);
    if (!item.ok()) {
      finish(ToGrpcStatus(item.status()));
      return reactor;
    }
    (*item)->done = [request, response, start, finish](const Status& s, InferenceResult&& r) {
      if (s.ok()) FillResponse(request->request_id(), r, start, response);
      finish(ToGrpcStatus(s));
    };
    std::vector<std::unique_ptr<InferenceRequest>> items;
    items.push_back(std::move(*item));
    if (Status s = server_->batcher_->Submit(items); !s.ok()) finish(ToGrpcStatus(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* PredictBatch(grpc::CallbackServerContext* ctx,
                                         const v1::PredictBatchRequest* request,
                                         v1::PredictBatchResponse* response) override {
    const auto start = Clock::now();
    auto* reactor = ctx->DefaultReactor();
    auto finish = [this, reactor, start](const grpc::Status& s) {
      Record("PredictBatch", s, start);
      reactor->Finish(s);
    };
    const int n = request->requests_size();
    if (n == 0) {
      finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "requests is empty (send at least one cube)"));
      return reactor;
    }
    if (n > server_->options_.max_queue) {
      finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "requests has " + std::to_string(n) +
                              " cubes, more than the queue holds (" +
                              std::to_string(server_->options_.max_queue) + "); split the batch"));
      return reactor;
    }
    // Shared by the n completions; the last one answers the RPC.
    struct State {
      std::mutex mu;
      int remaining;
      Status first_error;
    };
    auto state = std::make_shared<State>();
    state->remaining = n;
    for (int i = 0; i < n; ++i) response->add_responses();
    PrepareScope preparing(server_->batcher_.get());
    std::vector<std::unique_ptr<InferenceRequest>> items;
    for (int i = 0; i < n; ++i) {
      auto item = Prepare(request->requests(i), "requests[" + std::to_string(i) + "]", ctx);
      if (!item.ok()) {
        response->Clear();
        finish(ToGrpcStatus(item.status()));
        return reactor;
      }
      const auto& sub = request->requests(i);
      auto* out = response->mutable_responses(i);
      (*item)->done = [state, &sub, out, start, finish, response](const Status& s,
                                                                  InferenceResult&& r) {
        bool last;
        Status error;
        {
          std::lock_guard<std::mutex> lock(state->mu);
          if (s.ok()) {
            FillResponse(sub.request_id(), r, start, out);
          } else if (state->first_error.ok()) {
            state->first_error = s;
          }
          last = --state->remaining == 0;
          error = state->first_error;
        }
        if (last) {
          if (!error.ok()) response->Clear();
          finish(ToGrpcStatus(error));
        }
      };
      items.push_back(std::move(*item));
    }
    if (Status s = server_->batcher_->Submit(items); !s.ok()) {
      response->Clear();
      finish(ToGrpcStatus(s));
    }
    return reactor;
  }

  grpc::ServerBidiReactor<v1::PredictRequest, v1::PredictStreamResponse>* PredictStream(
      grpc::CallbackServerContext* ctx) override {
    auto* stream = new StreamReactor(this, ctx);
    if (Status s = stream_limits_.Open(ctx->peer(), stream); !s.ok()) {
      stream->Refuse(ToGrpcStatus(s));
    } else {
      stream->Start();
    }
    return stream;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest*,
                                         v1::ModelInfo* info) override {
    const auto start = Clock::now();
    auto* reactor = ctx->DefaultReactor();
    grpc::Status status;
    if (auto model = server_->batcher_->model()) {
      FillModelInfo(*model, server_->options_, info);
    } else {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "no model is loaded yet (the server is starting)");
    }
    Record("GetModelInfo", status, start);
    reactor->Finish(status);
    return reactor;
  }

  grpc::ServerUnaryReactor* ReloadModel(grpc::CallbackServerContext* ctx,
                                        const v1::ReloadModelRequest* request,
                                        v1::ReloadModelResponse* response) override {
    const auto start = Clock::now();
    auto* reactor = ctx->DefaultReactor();
    // Credentials first, then the path, both before any file is opened (server/admin.h).
    const Status authorized = server_->admin_.Authorize(*ctx);
    StatusOr<std::string> path =
        authorized.ok() ? server_->admin_.ResolveCheckpoint(request->checkpoint_path())
                        : StatusOr<std::string>(authorized);
    if (!path.ok()) {
      const grpc::Status status = ToGrpcStatus(path.status());
      CF_LOG(WARNING) << "ReloadModel refused (" << CodeName(status.error_code())
                      << ") from " << ctx->peer();
      Record("ReloadModel", status, start);
      reactor->Finish(status);
      return reactor;
    }
    // Loading builds and warms up networks: seconds of compute, so it runs on the reload thread.
    server_->ReloadAsync(*path, [this, reactor, response, start](
                                    const StatusOr<std::shared_ptr<Model>>& model, bool changed) {
      grpc::Status status = ToGrpcStatus(model.status());
      if (model.ok()) {
        FillModelInfo(**model, server_->options_, response->mutable_model());
        response->set_changed(changed);
      }
      Record("ReloadModel", status, start);
      reactor->Finish(status);
    });
    return reactor;
  }

 private:
  // One PredictStream call. Reads one message at a time; each valid cube goes to the batcher and
  // its reply is written when computed (replies may overtake each other: request_id matches them).
  // A bad message gets an error reply and the stream goes on. The reactor deletes itself in
  // OnDone, which gRPC calls only after Finish, and Finish is called only once reading has ended,
  // no cube is in the batcher and no write is pending; so no batcher callback can outlive it.
  class StreamReactor final
      : public grpc::ServerBidiReactor<v1::PredictRequest, v1::PredictStreamResponse>,
        public IdleStream {
   public:
    StreamReactor(Service* service, grpc::CallbackServerContext* ctx)
        : service_(service), ctx_(ctx), connection_(ctx->peer()) {}

    // Exactly one of Start (the stream is admitted: read its first message) and Refuse.
    void Start() {
      incoming_ = std::make_unique<v1::PredictRequest>();
      StartRead(incoming_.get());
    }
    void Refuse(const grpc::Status& status) {
      refused_ = true;
      service_->Record("PredictStream", status, Clock::now());
      Finish(status);
    }

    bool TryExpire(Clock::time_point idle_since) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || pending_ > 0 || writing_ || last_activity_ > idle_since) return false;
      finished_ = true;
      return true;
    }
    void FinishIdle(const grpc::Status& status) override {
      service_->Record("PredictStream", status, Clock::now());
      Finish(status);  // the outstanding read then completes with ok = false
    }

    void OnReadDone(bool ok) override {
      if (ok) {
        std::lock_guard<std::mutex> lock(mu_);
        last_activity_ = Clock::now();
        // Expired while this message arrived: nothing may be written after Finish.
        if (finished_) return;
      }
      if (!ok) {  // the client half-closed, or the call is broken
        bool finish;
        {
          std::lock_guard<std::mutex> lock(mu_);
          reads_done_ = true;
          finish = ShouldFinishLocked();
        }
        if (finish) Finish(grpc::Status::OK);
        return;
      }
      const auto start = Clock::now();
      std::shared_ptr<v1::PredictRequest> request = std::move(incoming_);
      incoming_ = std::make_unique<v1::PredictRequest>();
      PrepareScope preparing(service_->server_->batcher_.get());
      auto item = service_->Prepare(*request, "request", ctx_);
      if (item.ok()) {
        (*item)->done = [this, request, start](const Status& s, InferenceResult&& r) {
          auto reply = std::make_unique<v1::PredictStreamResponse>();
          reply->set_request_id(request->request_id());
          reply->set_code(int(s.code()));
          if (s.ok()) {
            FillResponse(request->request_id(), r, start, reply->mutable_result());
          } else {
            reply->set_message(s.message());
          }
          service_->Record("PredictStream", ToGrpcStatus(s), start);
          Reply(std::move(reply), /*was_pending=*/true);
        };
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++pending_;
        }
        std::vector<std::unique_ptr<InferenceRequest>> items;
        items.push_back(std::move(*item));
        Status s = service_->server_->batcher_->Submit(items);
        if (s.ok()) {
          StartRead(incoming_.get());
          return;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          --pending_;
        }
        item = s;
      }
      auto reply = std::make_unique<v1::PredictStreamResponse>();
      reply->set_request_id(request->request_id());
      reply->set_code(int(item.status().code()));
      reply->set_message(item.status().message());
      service_->Record("PredictStream", ToGrpcStatus(item.status()), start);
      // Reply before reading on: reads are not done, so Reply cannot finish the call; once
      // StartRead is issued, OnReadDone(false) may finish and delete this on another thread, so
      // StartRead is the last use of this.
      Reply(std::move(reply), /*was_pending=*/false);
      StartRead(incoming_.get());
    }

    void OnWriteDone(bool ok) override {
      const v1::PredictStreamResponse* next = nullptr;
      bool finish;
      {
        std::lock_guard<std::mutex> lock(mu_);
        writes_.pop_front();
        if (!ok) {  // the client is gone: drop what is left to write
          broken_ = true;
          writes_.clear();
        }
        if (!writes_.empty()) {
          next = writes_.front().get();
        } else {
          writing_ = false;
        }
        finish = ShouldFinishLocked();
      }
      // Outside the lock, and the last use of this: OnDone may follow on another thread.
      if (next) {
        StartWrite(next);
      } else if (finish) {
        Finish(grpc::Status::OK);
      }
    }

    void OnDone() override {
      if (!refused_) service_->stream_limits_.Close(connection_, this);
      delete this;
    }

   private:
    void Reply(std::unique_ptr<v1::PredictStreamResponse> reply, bool was_pending) {
      const v1::PredictStreamResponse* next = nullptr;
      bool finish;
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_activity_ = Clock::now();
        if (was_pending) --pending_;
        if (!broken_) {
          writes_.push_back(std::move(reply));
          if (!writing_) {
            writing_ = true;
            next = writes_.front().get();
          }
        }
        finish = ShouldFinishLocked();
      }
      // Last statement: once Finish is called, OnDone may delete this on another thread.
      if (next) {
        StartWrite(next);
      } else if (finish) {
        Finish(grpc::Status::OK);
      }
    }

    bool ShouldFinishLocked() {
      if (finished_ || !reads_done_ || pending_ > 0 || writing_) return false;
      finished_ = true;
      return true;
    }

    Service* service_;
    grpc::CallbackServerContext* ctx_;
    const std::string connection_;
    bool refused_ = false;  // by the per-connection stream limit: never registered
    Clock::time_point last_activity_ = Clock::now();  // last message received or reply queued
    std::unique_ptr<v1::PredictRequest> incoming_;  // target of the one outstanding read
    std::mutex mu_;
    std::deque<std::unique_ptr<v1::PredictStreamResponse>> writes_;  // front() is being written
    int pending_ = 0;                                                // cubes in the batcher
    bool reads_done_ = false;
    bool writing_ = false;
    bool broken_ = false;
    bool finished_ = false;
  };

  InferenceServer* server_;
  StreamLimits stream_limits_;
};

// ---- the server ----

namespace {

StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return NotFoundError(std::string("cannot read the TLS ") + what + " file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN") == std::string::npos)
    return InvalidArgumentError(std::string("the TLS ") + what + " file '" + path + "' is not PEM");
  return pem;
}

}  // namespace

void LimitMallocArenas() {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
}

InferenceServer::InferenceServer(const ServerOptions& options) : options_(options) {}

namespace {

Status ValidateOptions(const ServerOptions& options) {
  if (options.max_batch < 1 || options.max_batch > 256)
    return InvalidArgumentError("--max-batch " + std::to_string(options.max_batch) +
                                " is outside [1, 256]");
  if (options.max_queue < 1)
    return InvalidArgumentError("--max-queue " + std::to_string(options.max_queue) +
                                " must be positive");
  if (options.max_inflight_per_connection < 0 || options.max_streams_per_connection < 0 ||
      options.stream_idle_timeout.count() < 0)
    return InvalidArgumentError("per-connection limits must not be negative");
  if (options.max_message_bytes < 1024 || options.max_message_bytes > (int64_t{2} << 30) - 1)
    return InvalidArgumentError("--max-message-bytes " + std::to_string(options.max_message_bytes) +
                                " is outside [1 KiB, 2 GiB)");
  return Status::Ok();
}

BatcherOptions BatcherOptionsFor(const ServerOptions& options) {
  BatcherOptions b;
  b.max_batch = options.max_batch;
  b.max_queue_delay = options.max_queue_delay;
  b.max_queue = options.max_queue;
  b.max_prepare_wait = options.max_prepare_wait;
  b.adaptive = options.adaptive_batching;
  b.max_inflight_per_connection = options.max_inflight_per_connection > 0
                                      ? options.max_inflight_per_connection
                                      : options.max_queue;
  return b;
}

}  // namespace

StatusOr<std::unique_ptr<InferenceServer>> InferenceServer::Start(const ServerOptions& options) {
  CF_RETURN_IF_ERROR(ValidateOptions(options));

  std::unique_ptr<InferenceServer> server(new InferenceServer(options));
  CF_ASSIGN_OR_RETURN(server->admin_,
                      AdminGuard::Create(options.admin, options.checkpoint,
                                         !options.tls_client_ca.empty() && !options.tls_cert.empty()));
  if (server->admin_.enabled() && options.tls_cert.empty() && !options.admin.token_file.empty()) {
    CF_LOG(WARNING) << "admin calls are enabled without TLS: the admin token crosses the network "
                       "in the clear (use --tls-cert/--tls-key, or a loopback --address)";
  }
  if (!options.metrics_address.empty())
    CF_RETURN_IF_ERROR(server->metrics_.StartExposer(options.metrics_address));

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert.empty() || !options.tls_key.empty()) {
    if (options.tls_cert.empty() || options.tls_key.empty())
      return InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
    grpc::SslServerCredentialsOptions ssl;
    CF_ASSIGN_OR_RETURN(std::string cert, ReadPem(options.tls_cert, "certificate"));
    CF_ASSIGN_OR_RETURN(std::string key, ReadPem(options.tls_key, "key"));
    ssl.pem_key_cert_pairs.push_back({key, cert});
    if (!options.tls_client_ca.empty()) {
      CF_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_client_ca, "client CA"));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(ssl);
  } else if (!options.tls_client_ca.empty()) {
    return InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }

  server->batcher_ = std::make_unique<Batcher>(BatcherOptionsFor(options), &server->metrics_);
  server->service_ = std::make_unique<Service>(server.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  KServeBackend kserve;
  kserve.batcher = server->batcher_.get();
  kserve.metrics = &server->metrics_;
  kserve.max_queue = options.max_queue;
  kserve.serving = [s = server.get()] { return s->serving_.load(); };
  kserve.server_version = COSMOFLOW_VERSION;
  server->kserve_service_ = MakeKServeService(std::move(kserve));
  builder.RegisterService(server->kserve_service_.get());
  // Clients of replicas ping every few seconds to find dead links (client/channel.h): accept
  // pings down to 1 s apart, with or without calls, instead of closing the connection.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.SetMaxReceiveMessageSize(int(options.max_message_bytes));
  builder.SetMaxSendMessageSize(int(options.max_message_bytes));
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0)
    return UnavailableError("cannot listen on '" + options.address +
                            "' (address in use or invalid?)");
  // Nothing is served until a model is loaded and warmed up.
  server->SetServing(false);
  ReloaderOptions reload;
  reload.checkpoint = options.checkpoint;
  reload.model.max_batch = options.max_batch;
  reload.model.precision = options.precision;
  reload.model.kernel_selection = options.kernel_selection;
  reload.model.kernel_cache = options.kernel_cache;
  reload.watch_interval = options.watch_interval;
  server->reloader_ =
      std::make_unique<ModelReloader>(std::move(reload), server->batcher_.get(), &server->metrics_);
  CF_LOG(INFO) << "listening on port " << server->port_
               << (options.tls_cert.empty() ? " (plaintext)" : " (TLS)")
               << (options.metrics_address.empty()
                       ? std::string()
                       : ", metrics on port " + std::to_string(server->metrics_port()));
  return server;
}

void InferenceServer::SetServing(bool serving) {
  // The overall status ("") and the service's own name, which health clients may ask for.
  auto* health = server_->GetHealthCheckService();
  health->SetServingStatus(serving);
  health->SetServingStatus(v1::CosmoFlow::service_full_name(), serving);
  health->SetServingStatus("inference.GRPCInferenceService", serving);
  serving_.store(serving);
}

InferenceServer::~InferenceServer() { Shutdown(std::chrono::milliseconds(0)); }

Status InferenceServer::LoadInitialModel() {
  CF_RETURN_IF_ERROR(reloader_->LoadInitial());
  SetServing(true);
  return Status::Ok();
}

StatusOr<std::shared_ptr<Model>> InferenceServer::Reload(const std::string& path, bool* changed) {
  return reloader_->Reload(path, changed);
}

void InferenceServer::ReloadAsync(const std::string& path, ModelReloader::Done done) {
  reloader_->ReloadAsync(path, std::move(done));
}

void InferenceServer::Shutdown(std::chrono::milliseconds drain) {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_) {
    const auto deadline = std::chrono::system_clock::now() + drain;
    SetServing(false);
    // Health-checking clients (client/channel.h) route no new call here once they see NOT_SERVING,
    // but a call they routed just before is still on its way: refusing new calls at once would
    // cancel it. So the server keeps accepting for a short grace first.
    std::this_thread::sleep_for(std::min(kHealthGrace, drain / 4));
    // Refuses new calls and waits for in-flight ones (they still need the batcher), cancelling
    // whatever is left at the deadline.
    server_->Shutdown(deadline);
  }
  if (reloader_) reloader_->Stop();
  if (batcher_) batcher_->Stop();
  if (server_) server_->Wait();
  CF_LOG(INFO) << "server stopped";
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    stopped_ = true;
  }
  shutdown_cv_.notify_all();
}

void InferenceServer::Wait() {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  shutdown_cv_.wait(lock, [&] { return stopped_; });
}

}  // namespace cosmoflow
