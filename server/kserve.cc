#include "server/kserve.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "proto/cosmoflow.pb.h"
#include "proto/kserve_v2.grpc.pb.h"
#include "server/server.h"
#include "server/validate.h"

namespace cosmoflow {
namespace {

namespace kv2 = ::inference;
using Clock = std::chrono::steady_clock;

constexpr const char* kKServePlatform = "cosmoflow_onednn";
constexpr int64_t kMaxExtent = 4096;  // per cube axis; bounds the byte count before any allocation

// The served model if `name` and `version` (empty: any) name it.
StatusOr<std::shared_ptr<Model>> ResolveModel(Batcher* batcher, const std::string& name,
                                              const std::string& version) {
  if (name != kKServeModelName)
    return NotFoundError("model '" + name + "' is not served here (this server serves '" +
                         kKServeModelName + "')");
  std::shared_ptr<Model> model = batcher->model();
  if (!model) return UnavailableError("no model is loaded yet (the server is starting)");
  if (!version.empty() && version != model->version())
    return NotFoundError("model '" + name + "' has no version '" + version +
                         "' (the server runs '" + model->version() + "')");
  return model;
}

// One output tensor of the model: parameter `index`'s estimate or standard deviation, or the
// whole covariance matrix.
struct OutputTensor {
  enum Kind { kValue, kSigma, kCovariance } kind;
  int index = 0;
  std::string name;
};

// The model's output tensors, in the order ModelInfer returns them by default: one per
// parameter, named after it, then for a model with an uncertainty "<name>_sigma" per parameter
// and "covariance".
std::vector<OutputTensor> Outputs(const Model& model) {
  const auto& params = model.spec().outputs;
  std::vector<OutputTensor> all;
  for (int k = 0; k < int(params.size()); ++k)
    all.push_back({OutputTensor::kValue, k, params[size_t(k)].name});
  if (!model.has_uncertainty()) return all;
  for (int k = 0; k < int(params.size()); ++k)
    all.push_back({OutputTensor::kSigma, k, params[size_t(k)].name + "_sigma"});
  all.push_back({OutputTensor::kCovariance, 0, "covariance"});
  return all;
}

// The shape of one cube's share of `out` (the batch dimension not included).
std::vector<int64_t> CubeShape(const OutputTensor& out, int64_t p) {
  if (out.kind == OutputTensor::kCovariance) return {p, p};
  return {1};
}

// The parameter names joined by commas: the order of the covariance's rows and columns.
std::string ParameterNames(const Model& model) {
  std::string names;
  for (const auto& o : model.spec().outputs) names += (names.empty() ? "" : ",") + o.name;
  return names;
}

// The input tensor's element type and per-cube axis order.
struct InputFormat {
  v1::DType dtype = v1::DTYPE_INT16;
  size_t element_bytes = 2;
  v1::Layout layout = v1::LAYOUT_CHANNEL_FIRST;
};

StatusOr<InputFormat> ParseFormat(const kv2::ModelInferRequest::InferInputTensor& in) {
  InputFormat f;
  if (in.datatype() == "FP32") {
    f.dtype = v1::DTYPE_FLOAT32;
    f.element_bytes = 4;
  } else if (in.datatype() != "INT16") {
    return InvalidArgumentError("inputs[0].datatype is '" + in.datatype() +
                                "'; the model takes INT16 or FP32");
  }
  auto it = in.parameters().find("layout");
  if (it != in.parameters().end()) {
    const std::string& v = it->second.string_param();
    if (v == "channels_last") {
      f.layout = v1::LAYOUT_CHANNEL_LAST;
    } else if (v != "channels_first") {
      return InvalidArgumentError("inputs[0].parameters[layout] is '" + v +
                                  "'; expected channels_first or channels_last");
    }
  }
  return f;
}

// The input's elements as little-endian bytes: raw_input_contents[0], or the typed contents
// converted. `elements` is what the shape says.
StatusOr<std::string> InputBytes(const kv2::ModelInferRequest& req, const InputFormat& f,
                                 int64_t elements) {
  const auto& in = req.inputs(0);
  const int64_t want = elements * int64_t(f.element_bytes);
  if (req.raw_input_contents_size() > 0) {
    if (req.raw_input_contents_size() != 1)
      return InvalidArgumentError("raw_input_contents has " +
                                  std::to_string(req.raw_input_contents_size()) +
                                  " entries for 1 input");
    if (in.has_contents())
      return InvalidArgumentError("inputs[0] has both contents and raw_input_contents");
    const std::string& raw = req.raw_input_contents(0);
    if (int64_t(raw.size()) != want)
      return InvalidArgumentError("raw_input_contents[0] has " + std::to_string(raw.size()) +
                                  " bytes; the shape and datatype need " + std::to_string(want));
    return raw;
  }
  const auto& c = in.contents();
  const int64_t have = f.dtype == v1::DTYPE_INT16 ? c.int_contents_size() : c.fp32_contents_size();
  if (have != elements)
    return InvalidArgumentError(std::string("inputs[0].contents.") +
                                (f.dtype == v1::DTYPE_INT16 ? "int_contents" : "fp32_contents") +
                                " has " + std::to_string(have) + " elements; the shape needs " +
                                std::to_string(elements));
  std::string bytes(size_t(want), '\0');
  if (f.dtype == v1::DTYPE_FLOAT32) {
    std::memcpy(bytes.data(), c.fp32_contents().data(), bytes.size());
    return bytes;
  }
  for (int64_t i = 0; i < elements; ++i) {
    const int32_t v = c.int_contents(int(i));
    if (v < -32768 || v > 32767)
      return InvalidArgumentError("inputs[0].contents.int_contents[" + std::to_string(i) +
                                  "] = " + std::to_string(v) + " does not fit INT16");
    const int16_t s = int16_t(v);
    std::memcpy(bytes.data() + 2 * i, &s, 2);
  }
  return bytes;
}

// Splits the request's one input tensor into its N cubes (unvalidated cosmoflow.v1 cubes).
StatusOr<std::vector<v1::Cube>> SplitCubes(const kv2::ModelInferRequest& req, int max_queue) {
  if (req.inputs_size() != 1)
    return InvalidArgumentError("inputs has " + std::to_string(req.inputs_size()) +
                                " tensors; the model takes one, 'cube'");
  const auto& in = req.inputs(0);
  if (in.name() != "cube")
    return InvalidArgumentError("inputs[0].name is '" + in.name() +
                                "'; the model's input is 'cube'");
  CF_ASSIGN_OR_RETURN(InputFormat f, ParseFormat(in));
  if (in.shape_size() != 5)
    return InvalidArgumentError("inputs[0].shape has " + std::to_string(in.shape_size()) +
                                " dimensions; expected 5 (batch and one cube's 4)");
  const int64_t n = in.shape(0);
  if (n < 1 || n > max_queue)
    return InvalidArgumentError("inputs[0].shape[0] (the batch) is " + std::to_string(n) +
                                "; expected 1.." + std::to_string(max_queue));
  int64_t per_cube = 1;
  for (int k = 1; k < 5; ++k) {
    if (in.shape(k) < 1 || in.shape(k) > kMaxExtent)
      return InvalidArgumentError("inputs[0].shape[" + std::to_string(k) + "] is " +
                                  std::to_string(in.shape(k)) + "; expected 1.." +
                                  std::to_string(kMaxExtent));
    per_cube *= in.shape(k);
  }
  CF_ASSIGN_OR_RETURN(std::string bytes, InputBytes(req, f, n * per_cube));
  const size_t cube_bytes = size_t(per_cube) * f.element_bytes;
  std::vector<v1::Cube> cubes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v1::Cube& c = cubes[size_t(i)];
    for (int k = 1; k < 5; ++k) c.add_shape(in.shape(k));
    c.set_dtype(f.dtype);
    c.set_layout(f.layout);
    c.set_data(bytes.data() + size_t(i) * cube_bytes, cube_bytes);
  }
  return cubes;
}

// Checks the requested outputs against the model's; empty: all of them.
StatusOr<std::vector<OutputTensor>> RequestedOutputs(const kv2::ModelInferRequest& req,
                                                     const Model& model) {
  const std::vector<OutputTensor> all = Outputs(model);
  if (req.outputs_size() == 0) return all;
  std::vector<OutputTensor> wanted;
  for (int i = 0; i < req.outputs_size(); ++i) {
    const std::string& name = req.outputs(i).name();
    const OutputTensor* found = nullptr;
    for (const auto& a : all)
      if (a.name == name) found = &a;
    for (const auto& w : wanted)
      if (w.name == name)
        return InvalidArgumentError("outputs[" + std::to_string(i) + "].name '" + name +
                                    "' is requested twice");
    if (!found) {
      std::string list;
      for (const auto& a : all) list += (list.empty() ? "" : ", ") + a.name;
      return InvalidArgumentError("outputs[" + std::to_string(i) + "].name '" + name +
                                  "' is not an output of the model (" + list + ")");
    }
    wanted.push_back(*found);
  }
  return wanted;
}

// One ModelInfer call in flight: its cubes (whose bytes the batcher reads) and their results.
struct InferCall {
  std::vector<v1::Cube> cubes;
  std::vector<InferenceResult> results;
  std::vector<OutputTensor> outputs;
  std::mutex mu;
  int remaining = 0;
  Status first_error;
};

void AddOutput(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v,
               kv2::ModelInferResponse* resp) {
  auto* out = resp->add_outputs();
  out->set_name(name);
  out->set_datatype("FP32");
  for (int64_t d : shape) out->add_shape(d);
  resp->add_raw_output_contents(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void FillInferResponse(const kv2::ModelInferRequest& req, const InferCall& call,
                       kv2::ModelInferResponse* resp) {
  const Model& model = *call.results[0].model;
  const int64_t n = int64_t(call.results.size()), p = model.num_outputs();
  resp->set_model_name(kKServeModelName);
  resp->set_model_version(model.version());
  resp->set_id(req.id());
  for (const OutputTensor& out : call.outputs) {
    std::vector<float> v;
    for (const InferenceResult& r : call.results) {
      const int k = out.index;
      if (out.kind == OutputTensor::kValue) v.push_back(r.values[size_t(k)]);
      if (out.kind == OutputTensor::kSigma) v.push_back(float(std::sqrt(r.covariance[k * p + k])));
      if (out.kind == OutputTensor::kCovariance)
        v.insert(v.end(), r.covariance.begin(), r.covariance.end());
    }
    std::vector<int64_t> shape = CubeShape(out, p);
    shape.insert(shape.begin(), n);
    AddOutput(out.name, shape, v, resp);
    if (out.kind == OutputTensor::kCovariance)
      (*resp->mutable_outputs()->rbegin()->mutable_parameters())["names"].set_string_param(
          ParameterNames(model));
  }
}

// Triton's description of the model: what Triton's tools (perf_analyzer, model analyzer) read
// before sending requests.
void FillModelConfig(const Model& model, const KServeBackend& b, kv2::ModelConfig* config) {
  const ModelSpec& spec = model.spec();
  config->set_name(kKServeModelName);
  config->set_platform(kKServePlatform);
  config->set_backend("cosmoflow");
  config->set_max_batch_size(b.max_queue);
  auto* in = config->add_input();
  in->set_name("cube");
  in->set_data_type(kv2::TYPE_INT16);
  for (int64_t d : {int64_t{spec.input_channels}, int64_t{spec.input_side},
                    int64_t{spec.input_side}, int64_t{spec.input_side}})
    in->add_dims(d);
  for (const OutputTensor& o : Outputs(model)) {
    auto* out = config->add_output();
    out->set_name(o.name);
    out->set_data_type(kv2::TYPE_FP32);
    for (int64_t d : CubeShape(o, model.num_outputs())) out->add_dims(d);
  }
  auto* group = config->add_instance_group();
  group->set_name("cosmoflow_cpu");
  group->set_kind(kv2::ModelInstanceGroup::KIND_CPU);
  group->set_count(1);
  const BatcherOptions& batching = b.batcher->options();
  auto* dynamic = config->mutable_dynamic_batching();
  dynamic->add_preferred_batch_size(batching.max_batch);
  if (batching.max_queue_delay.count() >= 0)
    dynamic->set_max_queue_delay_microseconds(uint64_t(batching.max_queue_delay.count()));
  auto& params = *config->mutable_parameters();
  params["input_datatypes"].set_string_value("INT16,FP32");
  params["input_layouts"].set_string_value("channels_first,channels_last");
  params["covariance_order"].set_string_value(ParameterNames(model));
  params["model_version"].set_string_value(model.version());
}

class KServeService final : public kv2::GRPCInferenceService::CallbackService {
 public:
  explicit KServeService(KServeBackend backend) : b_(std::move(backend)) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const kv2::ServerLiveRequest*,
                                       kv2::ServerLiveResponse* resp) override {
    resp->set_live(true);  // answering at all is being live
    return Answer(ctx, "ServerLive", Clock::now(), grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const kv2::ServerReadyRequest*,
                                        kv2::ServerReadyResponse* resp) override {
    resp->set_ready(b_.serving() && b_.batcher->model() != nullptr);
    return Answer(ctx, "ServerReady", Clock::now(), grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const kv2::ModelReadyRequest* req,
                                       kv2::ModelReadyResponse* resp) override {
    const auto start = Clock::now();
    if (req->name() != kKServeModelName)
      return Answer(ctx, "ModelReady", start,
                    ToGrpcStatus(ResolveModel(b_.batcher, req->name(), "").status()));
    auto model = ResolveModel(b_.batcher, req->name(), req->version());
    resp->set_ready(model.ok() && b_.serving());
    return Answer(ctx, "ModelReady", start, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const kv2::ServerMetadataRequest*,
                                           kv2::ServerMetadataResponse* resp) override {
    resp->set_name("cosmoflow-server");
    resp->set_version(b_.server_version);
    return Answer(ctx, "ServerMetadata", Clock::now(), grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const kv2::ModelMetadataRequest* req,
                                          kv2::ModelMetadataResponse* resp) override {
    const auto start = Clock::now();
    auto model = ResolveModel(b_.batcher, req->name(), req->version());
    if (!model.ok()) return Answer(ctx, "ModelMetadata", start, ToGrpcStatus(model.status()));
    const ModelSpec& spec = (*model)->spec();
    resp->set_name(kKServeModelName);
    resp->add_versions((*model)->version());
    resp->set_platform(kKServePlatform);
    auto* in = resp->add_inputs();
    in->set_name("cube");
    in->set_datatype("INT16");
    for (int64_t d : {int64_t{-1}, int64_t{spec.input_channels}, int64_t{spec.input_side},
                      int64_t{spec.input_side}, int64_t{spec.input_side}})
      in->add_shape(d);
    for (const OutputTensor& o : Outputs(**model)) {
      auto* out = resp->add_outputs();
      out->set_name(o.name);
      out->set_datatype("FP32");
      out->add_shape(-1);
      for (int64_t d : CubeShape(o, (*model)->num_outputs())) out->add_shape(d);
    }
    return Answer(ctx, "ModelMetadata", start, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const kv2::ModelConfigRequest* req,
                                        kv2::ModelConfigResponse* resp) override {
    const auto start = Clock::now();
    auto model = ResolveModel(b_.batcher, req->name(), req->version());
    if (!model.ok()) return Answer(ctx, "ModelConfig", start, ToGrpcStatus(model.status()));
    FillModelConfig(**model, b_, resp->mutable_config());
    return Answer(ctx, "ModelConfig", start, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const kv2::ModelInferRequest* req,
                                       kv2::ModelInferResponse* resp) override;

 private:
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const char* method,
                                   Clock::time_point start, const grpc::Status& status) {
    Record(method, status, start);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  void Record(const char* method, const grpc::Status& status, Clock::time_point start) {
    b_.metrics->RecordRequest(
        method, StatusCodeName(static_cast<StatusCode>(int(status.error_code()))),
        std::chrono::duration<double>(Clock::now() - start).count());
  }

  // Validates every cube of the call into a batcher entry whose completion answers the RPC
  // once the last cube is done.
  StatusOr<std::vector<std::unique_ptr<InferenceRequest>>> MakeItems(
      const std::shared_ptr<InferCall>& call, const ModelSpec& spec,
      grpc::CallbackServerContext* ctx, std::function<void(const Status&)> finish);

  KServeBackend b_;
};

StatusOr<std::vector<std::unique_ptr<InferenceRequest>>> KServeService::MakeItems(
    const std::shared_ptr<InferCall>& call, const ModelSpec& spec,
    grpc::CallbackServerContext* ctx, std::function<void(const Status&)> finish) {
  std::vector<std::unique_ptr<InferenceRequest>> items;
  call->results.resize(call->cubes.size());
  call->remaining = int(call->cubes.size());
  for (size_t i = 0; i < call->cubes.size(); ++i) {
    CF_ASSIGN_OR_RETURN(CubeView view,
                        ValidateCube(call->cubes[i], {spec.input_channels, spec.input_side},
                                     "inputs[0][" + std::to_string(i) + "]"));
    auto item = std::make_unique<InferenceRequest>();
    item->cube = view;
    item->connection = ctx->peer();
    item->deadline = ctx->deadline();
    item->cancelled = [ctx] { return ctx->IsCancelled(); };
    item->done = [call, i, finish](const Status& s, InferenceResult&& r) {
      Status error;
      {
        std::lock_guard<std::mutex> lock(call->mu);
        if (s.ok()) call->results[i] = std::move(r);
        if (!s.ok() && call->first_error.ok()) call->first_error = s;
        if (--call->remaining > 0) return;
        error = call->first_error;
      }
      finish(error);
    };
    items.push_back(std::move(item));
  }
  return items;
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(grpc::CallbackServerContext* ctx,
                                                    const kv2::ModelInferRequest* req,
                                                    kv2::ModelInferResponse* resp) {
  const auto start = Clock::now();
  for (const auto& raw : req->raw_input_contents()) b_.metrics->AddReceivedBytes(double(raw.size()));
  PrepareScope preparing(b_.batcher);
  auto model = ResolveModel(b_.batcher, req->model_name(), req->model_version());
  if (!model.ok()) return Answer(ctx, "ModelInfer", start, ToGrpcStatus(model.status()));
  auto call = std::make_shared<InferCall>();
  auto cubes = SplitCubes(*req, b_.max_queue);
  auto outputs = cubes.ok() ? RequestedOutputs(*req, **model)
                            : StatusOr<std::vector<OutputTensor>>(cubes.status());
  if (!outputs.ok()) return Answer(ctx, "ModelInfer", start, ToGrpcStatus(outputs.status()));
  call->cubes = std::move(*cubes);
  call->outputs = std::move(*outputs);
  auto* reactor = ctx->DefaultReactor();
  auto finish = [this, reactor, req, resp, call, start](const Status& s) {
    // A reload between validation and compute can drop the uncertainty an output needs.
    Status status = s;
    bool wants_covariance = false;
    for (const OutputTensor& out : call->outputs)
      wants_covariance = wants_covariance || out.kind != OutputTensor::kValue;
    for (const InferenceResult& r : call->results)
      if (status.ok() && wants_covariance && r.covariance.empty())
        status = UnavailableError("the model changed during the call and has no uncertainty now");
    if (status.ok()) FillInferResponse(*req, *call, resp);
    const grpc::Status g = ToGrpcStatus(status);
    Record("ModelInfer", g, start);
    reactor->Finish(g);
  };
  auto items = MakeItems(call, (*model)->spec(), ctx, finish);
  Status submitted = items.ok() ? b_.batcher->Submit(*items) : items.status();
  if (!submitted.ok()) {
    const grpc::Status g = ToGrpcStatus(submitted);
    Record("ModelInfer", g, start);
    reactor->Finish(g);
  }
  return reactor;
}

}  // namespace

std::unique_ptr<grpc::Service> MakeKServeService(KServeBackend backend) {
  return std::make_unique<KServeService>(std::move(backend));
}

}  // namespace cosmoflow
