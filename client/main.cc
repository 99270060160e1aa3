// cosmoflow-client: the command-line client of cosmoflow-server, for single cubes and scripts.
// A thin shell: read a cube (core/io), send it, print the answer. See docs/serving.md.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "client/channel.h"
#include "core/base/flags.h"
#include "core/base/truncated_normal.h"
#include "core/io/dataset.h"
#include "core/io/npy.h"
#include "proto/cosmoflow.grpc.pb.h"
#include "proto/health.grpc.pb.h"

namespace {

using namespace cosmoflow;

// Exit codes, stable for scripts (docs/serving.md).
enum ExitCode {
  kExitOk = 0,
  kExitOther = 1,        // any other gRPC error (INTERNAL, UNKNOWN, ...)
  kExitUsage = 2,        // bad flags or command
  kExitInput = 3,        // the cube file cannot be read or does not match --shape/--dtype
  kExitUnavailable = 4,  // no server at --address, TLS handshake failed, server shutting down
  kExitRejected = 5,     // the server refused the request (INVALID_ARGUMENT, FAILED_PRECONDITION,
                         // RESOURCE_EXHAUSTED, OUT_OF_RANGE, UNAUTHENTICATED, PERMISSION_DENIED,
                         // UNIMPLEMENTED: e.g. reload on a server without --enable-admin)
  kExitDeadline = 6,     // --timeout passed
  kExitNotServing = 7,   // health: the server answers but is not SERVING
};

int Fail(int code, const std::string& message) {
  std::cerr << "cosmoflow-client: error: " << message << "\n";
  return code;
}

int ExitCodeFor(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::UNAVAILABLE:
      return kExitUnavailable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitDeadline;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNIMPLEMENTED:
      return kExitRejected;
    default:
      return kExitOther;
  }
}

int RpcFail(const grpc::Status& s) {
  std::string message = s.error_message();
  for (auto& c : message)
    if (c == '\n') c = ' ';  // one line, always
  return Fail(ExitCodeFor(s),
              std::string(StatusCodeName(StatusCode(int(s.error_code())))) + ": " + message);
}

StatusOr<std::string> ReadText(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(std::string("cannot read ") + what + " '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, 'x');) {
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v <= 0)
      return InvalidArgumentError("--shape '" + text + "' is not like 1x128x128x128");
    shape.push_back(v);
  }
  if (shape.size() != 3 && shape.size() != 4)
    return InvalidArgumentError("--shape '" + text + "' needs 3 or 4 extents");
  return shape;
}

// Fills request.cube from --npy, --h5 or --raw. Errors name the file; `*usage` tells whether the
// flags (rather than a file) were at fault.
Status LoadCube(const Flags& flags, v1::PredictRequest* request, bool* usage) {
  *usage = true;
  auto* cube = request->mutable_cube();
  const std::string layout_name = flags.Get("layout", "channel-first");
  if (layout_name != "channel-first" && layout_name != "channel-last")
    return InvalidArgumentError("--layout must be channel-first or channel-last, not '" +
                                layout_name + "'");
  const bool channel_last = layout_name == "channel-last";
  const int sources = int(flags.Has("npy")) + int(flags.Has("h5")) + int(flags.Has("raw"));
  if (sources != 1) return InvalidArgumentError("predict needs exactly one of --npy, --h5, --raw");

  auto set_cube = [&](const Cube& c) {
    for (int64_t e : {c.shape().channels, c.shape().depth, c.shape().height, c.shape().width})
      cube->add_shape(e);
    cube->set_dtype(c.dtype() == DType::kInt16 ? v1::DTYPE_INT16 : v1::DTYPE_FLOAT32);
    cube->set_layout(v1::LAYOUT_CHANNEL_FIRST);
    cube->set_data(std::string(static_cast<const char*>(c.raw()), c.size_bytes()));
  };
  if (flags.Has("h5") && !flags.Has("dataset"))
    return InvalidArgumentError("--h5 needs --dataset PATH (e.g. /cubes)");
  auto index = flags.GetInt("index", 0);
  if (!index.ok()) return index.status();
  if (flags.Has("raw") && (!flags.Has("shape") || !flags.Has("dtype")))
    return InvalidArgumentError("--raw needs --shape and --dtype");
  std::vector<int64_t> shape;
  DType dtype = DType::kInt16;
  if (flags.Has("raw")) {
    CF_ASSIGN_OR_RETURN(shape, ParseShape(flags.Get("shape")));
    CF_ASSIGN_OR_RETURN(dtype, ParseDType(flags.Get("dtype")));
  }
  *usage = false;  // from here on, errors are about the input file
  if (flags.Has("npy")) {
    CF_ASSIGN_OR_RETURN(
        Cube c, ReadNpy(flags.Get("npy"),
                        channel_last ? AxisLayout::kChannelLast : AxisLayout::kChannelFirst));
    set_cube(c);
    return Status::Ok();
  }
  if (flags.Has("h5")) {
    CF_ASSIGN_OR_RETURN(Cube c, ReadHdf5Cube(flags.Get("h5"), flags.Get("dataset"), *index));
    set_cube(c);
    return Status::Ok();
  }
  CF_ASSIGN_OR_RETURN(std::string bytes, ReadText(flags.Get("raw"), "raw cube file"));
  int64_t elements = 1;
  for (auto e : shape) elements *= e;
  if (int64_t(bytes.size()) != elements * int64_t(DTypeSize(dtype)))
    return InvalidArgumentError("raw cube file '" + flags.Get("raw") + "' has " +
                                std::to_string(bytes.size()) + " bytes, but --shape " +
                                flags.Get("shape") + " of " + DTypeName(dtype) + " needs " +
                                std::to_string(elements * DTypeSize(dtype)));
  for (auto e : shape) cube->add_shape(e);
  cube->set_dtype(dtype == DType::kInt16 ? v1::DTYPE_INT16 : v1::DTYPE_FLOAT32);
  cube->set_layout(channel_last ? v1::LAYOUT_CHANNEL_LAST : v1::LAYOUT_CHANNEL_FIRST);
  cube->set_data(std::move(bytes));
  return Status::Ok();
}

std::string Format(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string FormatFixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

constexpr double kLevel68 = 0.682689492137;  // the mass within one sigma of a Gaussian

// The decimal place of sigma's second significant digit (the digits beyond carry no information).
int SigmaDecimals(double sigma) {
  return std::clamp(1 - int(std::floor(std::log10(sigma))), 0, 12);
}

// "0.3012 ± 0.0061": sigma to two significant digits and the value to the same decimal place.
std::string FormatWithSigma(double value, double sigma) {
  if (!(sigma > 0) || !std::isfinite(sigma)) return Format(value);
  const int decimals = SigmaDecimals(sigma);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.*f \u00b1 %.*f", decimals, value, decimals, sigma);
  return buf;
}

bool HasUncertainty(const v1::PredictResponse& r) {
  return r.parameters_size() > 0 && r.parameters(0).has_sigma() &&
         r.covariance_size() == r.parameters_size() * r.parameters_size();
}

// Per parameter, the central 68.3% interval of the truncated posterior (TruncatedInterval on the
// prior the model was calibrated on), which is what sigma means for a model with a prior: for a
// parameter whose posterior fills its prior (n_s), value -+ sigma reaches beyond the prior. Empty
// without uncertainty, without a prior, with a sigma that is not positive and finite, or when
// `info` describes another model version than the one that answered.
std::vector<Interval> PosteriorIntervals(const v1::PredictResponse& r, const v1::ModelInfo& info) {
  const int n = r.parameters_size();
  if (!HasUncertainty(r) || info.version() != r.model_version() || info.prior_low_size() != n ||
      info.prior_high_size() != n)
    return {};
  std::vector<Interval> out;
  for (int i = 0; i < n; ++i) {
    const double sigma = r.parameters(i).sigma();
    if (!(sigma > 0) || !std::isfinite(sigma)) return {};
    out.push_back(TruncatedInterval(r.parameters(i).value(), sigma, info.prior_low(i),
                                    info.prior_high(i), kLevel68));
  }
  return out;
}

// {"parameters", "units", "sigma", "covariance", "interval_68"}: sigma and covariance (rows in
// output order) are null when the model has no uncertainty, never 0; interval_68 ([low, high] by
// name) is null without a prior.
void AddPrediction(const v1::PredictResponse& resp, const std::vector<Interval>& intervals,
                   nlohmann::ordered_json* j) {
  nlohmann::ordered_json params = nlohmann::ordered_json::object(),
                         units = nlohmann::ordered_json::object(), sigma = nullptr, cov = nullptr;
  for (const auto& p : resp.parameters()) {
    params[p.name()] = p.value();
    units[p.name()] = p.unit();
  }
  if (HasUncertainty(resp)) {
    const int n = resp.parameters_size();
    sigma = nlohmann::ordered_json::object();
    cov = nlohmann::ordered_json::array();
    for (int i = 0; i < n; ++i) {
      sigma[resp.parameters(i).name()] = resp.parameters(i).sigma();
      cov.push_back(std::vector<double>(resp.covariance().begin() + i * n, resp.covariance().begin() + (i + 1) * n));
    }
  }
  (*j)["parameters"] = params;
  (*j)["units"] = units;
  (*j)["sigma"] = sigma;
  (*j)["covariance"] = cov;
  nlohmann::ordered_json iv = nullptr;
  for (size_t i = 0; i < intervals.size(); ++i)
    iv[resp.parameters(int(i)).name()] = {intervals[i].low, intervals[i].high};
  (*j)["interval_68"] = iv;
}

void PrintPredictionTable(const v1::PredictResponse& resp, const std::vector<Interval>& intervals) {
  const bool unc = HasUncertainty(resp);
  std::printf("%-10s %-22s %s%s\n", "parameter", unc ? "value \u00b1 sigma" : "value",
              intervals.empty() ? "" : "68.3% interval        ", "unit");
  for (int i = 0; i < resp.parameters_size(); ++i) {
    const auto& p = resp.parameters(i);
    const std::string v = unc ? FormatWithSigma(p.value(), p.sigma()) : Format(p.value());
    char iv[64] = "";
    if (!intervals.empty()) {
      const int d = SigmaDecimals(p.sigma());
      const std::string range =
          FormatFixed(intervals[i].low, d) + " - " + FormatFixed(intervals[i].high, d);
      std::snprintf(iv, sizeof(iv), "%-21s ", range.c_str());
    }
    std::printf("%-10s %-22s %s%s\n", p.name().c_str(), v.c_str(), iv, p.unit().c_str());
  }
  if (!unc) {
    std::printf("uncertainty: none (this model gives no sigma)\n");
    return;
  }
  const int n = resp.parameters_size();
  std::string line;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      const double r = resp.covariance(i * n + j) /
                       std::sqrt(resp.covariance(i * n + i) * resp.covariance(j * n + j));
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%s%s/%s %+.2f", line.empty() ? "" : ", ",
                    resp.parameters(i).name().c_str(), resp.parameters(j).name().c_str(), r);
      line += buf;
    }
  if (!line.empty()) std::printf("correlation: %s\n", line.c_str());
}

// "ensemble of 5 (gaussian_full heads), sigma calibrated x1.04 / 0.98 / 2.1 on 512 validation
// cubes", each factor followed by " (sigma^0.8)" for a power calibration.
std::string UncertaintyText(const v1::ModelInfo& info) {
  std::string t = info.uncertainty().empty() ? "none" : info.uncertainty();
  if (t == "ensemble") t += " of " + std::to_string(info.ensemble_members());
  if (info.uncertainty_head() != "none" && !info.uncertainty_head().empty())
    t += " (" + info.uncertainty_head() + " head" + (info.ensemble_members() > 1 ? "s)" : ")");
  if (info.calibration_size() > 0) {
    t += ", sigma calibrated x";
    char f[32];
    for (int i = 0; i < info.calibration_size(); ++i) {
      std::snprintf(f, sizeof(f), "%.3g", info.calibration(i));
      t += (i ? " / " : "") + std::string(f);
      if (i < info.calibration_exponent_size()) {
        std::snprintf(f, sizeof(f), " (sigma^%.2g)", info.calibration_exponent(i));
        t += f;
      }
      if (i < info.calibration_edge_size() && info.calibration_edge(i) != 0) {
        std::snprintf(f, sizeof(f), " (edge %.2g)", info.calibration_edge(i));
        t += f;
      }
    }
    t += " on " + std::to_string(info.calibration_samples()) + " validation cubes";
  }
  return t;
}

// ModelInfo's uncertainty fields, for info --json.
void AddUncertaintyInfo(const v1::ModelInfo& info, nlohmann::json* j) {
  (*j)["uncertainty"] = info.uncertainty().empty() ? "none" : info.uncertainty();
  (*j)["uncertainty_head"] = info.uncertainty_head();
  (*j)["ensemble_members"] = info.ensemble_members();
  (*j)["calibration"] = std::vector<double>(info.calibration().begin(), info.calibration().end());
  (*j)["calibration_samples"] = info.calibration_samples();
  (*j)["calibration_exponent"] =
      std::vector<double>(info.calibration_exponent().begin(), info.calibration_exponent().end());
  (*j)["calibration_reference"] =
      std::vector<double>(info.calibration_reference().begin(), info.calibration_reference().end());
  (*j)["calibration_edge"] = std::vector<double>(info.calibration_edge().begin(), info.calibration_edge().end());
  (*j)["prior_low"] = std::vector<double>(info.prior_low().begin(), info.prior_low().end());
  (*j)["prior_high"] = std::vector<double>(info.prior_high().begin(), info.prior_high().end());
  (*j)["member_checkpoints"] = std::vector<std::string>(info.member_checkpoints().begin(),
                                                        info.member_checkpoints().end());
}

// The flags every command shares, checked once.
struct CallOptions {
  const Flags& flags;
  double timeout_s = 30;
  int64_t max_message_bytes = 64 << 20;
  bool json = false;
};

// The channel to --address (one server, or replicas: client/channel.h), with TLS when --tls-* is
// given. Returns kExitOk, or the exit code of a
// bad flag or an unreadable TLS file (after printing why).
int Connect(const CallOptions& call, std::shared_ptr<grpc::Channel>* channel) {
  const Flags& flags = call.flags;
  const std::string address = flags.Get("address", "127.0.0.1:8500");
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(int(call.max_message_bytes));
  args.SetMaxSendMessageSize(int(call.max_message_bytes));
  if (flags.Has("tls-ca") || flags.Has("tls-cert") || flags.Has("tls-key")) {
    grpc::SslCredentialsOptions ssl;
    if (flags.Has("tls-ca")) {
      auto ca = ReadText(flags.Get("tls-ca"), "TLS CA file");
      if (!ca.ok()) return Fail(kExitInput, ca.status().message());
      ssl.pem_root_certs = *ca;
    }
    if (flags.Has("tls-cert") != flags.Has("tls-key"))
      return Fail(kExitUsage, "--tls-cert and --tls-key go together");
    if (flags.Has("tls-cert")) {
      auto cert = ReadText(flags.Get("tls-cert"), "TLS certificate");
      auto key = ReadText(flags.Get("tls-key"), "TLS key");
      if (!cert.ok()) return Fail(kExitInput, cert.status().message());
      if (!key.ok()) return Fail(kExitInput, key.status().message());
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
    if (flags.Has("tls-server-name")) args.SetSslTargetNameOverride(flags.Get("tls-server-name"));
  }
  *channel = MakeClientChannel(address, creds, args);
  return kExitOk;
}

void SetDeadline(const CallOptions& call, grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(int64_t(call.timeout_s * 1000)));
}

int RunHealth(const CallOptions& call) {
  std::shared_ptr<grpc::Channel> channel;
  if (int code = Connect(call, &channel); code != kExitOk) return code;
  grpc::ClientContext ctx;
  SetDeadline(call, &ctx);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(call.flags.Get("service"));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return RpcFail(s);
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                         : kExitNotServing;
}

void PrintModelInfo(const v1::ModelInfo& info, bool json) {
  if (json) {
    nlohmann::json j;
    j["version"] = info.version();
    j["checksum"] = info.checksum();
    j["spec_name"] = info.spec_name();
    j["input_shape"] = std::vector<int64_t>(info.input_shape().begin(), info.input_shape().end());
    j["input_transform"] = info.input_transform();
    j["num_parameters"] = info.num_parameters();
    j["step"] = info.step();
    j["epoch"] = info.epoch();
    j["checkpoint_path"] = info.checkpoint_path();
    j["max_batch"] = info.max_batch();
    j["max_message_bytes"] = info.max_message_bytes();
    j["precision"] = info.precision();
    j["outputs"] = nlohmann::json::array();
    for (const auto& o : info.outputs())
      j["outputs"].push_back(
          {{"name", o.name()}, {"unit", o.unit()}, {"offset", o.offset()}, {"scale", o.scale()}});
    j["provenance"] =
        std::map<std::string, std::string>(info.provenance().begin(), info.provenance().end());
    AddUncertaintyInfo(info, &j);
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  std::string shape;
  for (int i = 0; i < info.input_shape_size(); ++i)
    shape += (i ? "x" : "") + std::to_string(info.input_shape(i));
  std::cout << "version          " << info.version() << "\n"
            << "spec             " << info.spec_name() << " (" << info.num_parameters()
            << " weights)\n"
            << "input            " << shape << " int16|float32, transform "
            << info.input_transform() << "\n"
            << "outputs         ";
  for (const auto& o : info.outputs())
    std::cout << " " << o.name() << (o.unit().empty() ? "" : " [" + o.unit() + "]");
  std::cout << "\n"
            << "checkpoint       " << info.checkpoint_path() << " (step " << info.step()
            << ", checksum " << info.checksum() << ")\n"
            << "serving          max batch " << info.max_batch() << ", " << info.precision()
            << "\n"
            << "uncertainty      " << UncertaintyText(info) << "\n";
}

int RunInfo(const CallOptions& call) {
  std::shared_ptr<grpc::Channel> channel;
  if (int code = Connect(call, &channel); code != kExitOk) return code;
  grpc::ClientContext ctx;
  SetDeadline(call, &ctx);
  auto stub = v1::CosmoFlow::NewStub(channel);
  v1::ModelInfo info;
  grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
  if (!s.ok()) return RpcFail(s);
  PrintModelInfo(info, call.json);
  return kExitOk;
}

void PrintPrediction(const v1::PredictResponse& resp, const std::vector<Interval>& intervals,
                     bool json) {
  if (json) {
    nlohmann::ordered_json j;
    j["request_id"] = resp.request_id();
    j["model_version"] = resp.model_version();
    AddPrediction(resp, intervals, &j);
    j["timings"] = {{"queue_seconds", resp.timings().queue_seconds()},
                    {"compute_seconds", resp.timings().compute_seconds()},
                    {"total_seconds", resp.timings().total_seconds()},
                    {"batch_size", resp.timings().batch_size()}};
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  PrintPredictionTable(resp, intervals);
  std::printf("model %s, batch %d, queue %.4f s, compute %.4f s, server total %.4f s\n",
              resp.model_version().c_str(), resp.timings().batch_size(),
              resp.timings().queue_seconds(), resp.timings().compute_seconds(),
              resp.timings().total_seconds());
}

int RunPredict(const CallOptions& call) {
  // Read the input before connecting: a bad file is the user's error, not the server's.
  v1::PredictRequest request;
  bool usage = false;
  if (Status s = LoadCube(call.flags, &request, &usage); !s.ok())
    return Fail(usage ? kExitUsage : kExitInput, s.message());
  request.set_request_id(call.flags.Get("request-id"));
  request.set_model_version(call.flags.Get("model-version"));
  std::shared_ptr<grpc::Channel> channel;
  if (int code = Connect(call, &channel); code != kExitOk) return code;
  grpc::ClientContext ctx;
  SetDeadline(call, &ctx);
  auto stub = v1::CosmoFlow::NewStub(channel);
  v1::PredictResponse resp;
  grpc::Status s = stub->Predict(&ctx, request, &resp);
  if (!s.ok()) return RpcFail(s);
  // The prior for the intervals; a server that cannot say (or has reloaded meanwhile) gets none.
  v1::ModelInfo info;
  if (HasUncertainty(resp)) {
    grpc::ClientContext info_ctx;
    SetDeadline(call, &info_ctx);
    if (!stub->GetModelInfo(&info_ctx, {}, &info).ok()) info.Clear();
  }
  PrintPrediction(resp, PosteriorIntervals(resp, info), call.json);
  return kExitOk;
}

// The admin token for `reload`: the first line of --admin-token-file, without trailing space (the
// same file the server reads). Not a flag value: command lines are visible to every local user.
int ReadAdminToken(const Flags& flags, std::string* token) {
  if (!flags.Has("admin-token-file")) return kExitOk;
  auto text = ReadText(flags.Get("admin-token-file"), "admin token file");
  if (!text.ok()) return Fail(kExitInput, text.status().message());
  *token = *text;
  while (!token->empty() && std::isspace(static_cast<unsigned char>(token->back())))
    token->pop_back();
  if (token->empty()) return Fail(kExitInput, "the admin token file is empty");
  return kExitOk;
}

int RunReload(const CallOptions& call) {
  std::string token;
  if (int code = ReadAdminToken(call.flags, &token); code != kExitOk) return code;
  std::shared_ptr<grpc::Channel> channel;
  if (int code = Connect(call, &channel); code != kExitOk) return code;
  grpc::ClientContext ctx;
  SetDeadline(call, &ctx);
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto stub = v1::CosmoFlow::NewStub(channel);
  v1::ReloadModelRequest request;
  request.set_checkpoint_path(call.flags.Get("checkpoint-path"));
  v1::ReloadModelResponse resp;
  grpc::Status s = stub->ReloadModel(&ctx, request, &resp);
  if (!s.ok()) return RpcFail(s);
  if (!call.json) std::cout << (resp.changed() ? "reloaded" : "unchanged (already serving)") << "\n";
  PrintModelInfo(resp.model(), call.json);
  return kExitOk;
}

// The subcommands: name, their lines of the usage text, handler (returns the exit code).
struct Command {
  const char* name;
  const char* usage;
  int (*run)(const CallOptions& call);
};
constexpr Command kCommands[] = {
    {"predict",
     "  predict  --npy FILE [--layout channel-first|channel-last]\n"
     "           --h5 FILE --dataset PATH [--index N]\n"
     "           --raw FILE --shape CxDxHxW|DxHxW --dtype int16|float32 [--layout ...]\n"
     "           [--json] [--request-id ID] [--model-version V]\n",
     RunPredict},
    {"info", "  info     [--json]        model version, spec, outputs, input shape\n", RunInfo},
    {"health", "  health   [--service S]   exit 0 if SERVING, 7 if not\n", RunHealth},
    {"reload",
     "  reload   [--checkpoint-path P] [--admin-token-file FILE] [--json]\n"
     "           load P (under the server's checkpoint root; default: its --checkpoint)\n",
     RunReload},
};

constexpr char kFlagsUsage[] = R"(flags:
  --address TARGET         server HOST:PORT (default 127.0.0.1:8500), or replicas:
                           ipv4:H1:P1,H2:P2,... or dns:///NAME:PORT (round_robin, health-checked,
                           UNAVAILABLE retried)
  --timeout S              deadline per call (default 30)
  --max-message-bytes N    receive/send limit (default 67108864)
  --tls-ca PEM             use TLS, trusting this CA  [--tls-cert PEM --tls-key PEM] client certificate
  --tls-server-name NAME   expected name in the server certificate (default: the host of --address)
exit codes: 0 ok, 1 other error, 2 usage, 3 input file, 4 unavailable, 5 rejected by the server,
            6 deadline exceeded, 7 not serving
)";

// "predict|info|health" with separator "|", or "predict, info or health".
std::string CommandNames(const char* separator, const char* last_separator) {
  std::string names;
  const size_t n = std::size(kCommands);
  for (size_t i = 0; i < n; ++i)
    names += (i == 0       ? ""
              : i + 1 == n ? last_separator
                           : separator) +
             std::string(kCommands[i].name);
  return names;
}

std::string UsageText() {
  std::string text =
      "usage: cosmoflow-client [flags] " + CommandNames("|", "|") + " [command flags]\n";
  for (const Command& c : kCommands) text += c.usage;
  return text + kFlagsUsage;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags({{"address", true},         {"timeout", true},    {"max-message-bytes", true},
               {"tls-ca", true},          {"tls-cert", true},   {"tls-key", true},
               {"tls-server-name", true}, {"npy", true},        {"h5", true},
               {"dataset", true},         {"index", true},      {"raw", true},
               {"shape", true},           {"dtype", true},      {"layout", true},
               {"json", false},           {"request-id", true}, {"model-version", true},
               {"service", true},         {"checkpoint-path", true},
               {"admin-token-file", true}, {"help", false}});
  if (Status s = flags.Parse(argc, argv); !s.ok())
    return Fail(kExitUsage, s.message() + " (see --help)");
  if (flags.Has("help")) {
    std::cout << UsageText();
    return kExitOk;
  }
  if (flags.positional().size() != 1)
    return Fail(kExitUsage,
                "expected one command: " + CommandNames(", ", " or ") + " (see --help)");
  const std::string name = flags.positional()[0];
  const Command* command = FindCommand(name);
  if (command == nullptr)
    return Fail(kExitUsage, "unknown command '" + name + "' (" + CommandNames(", ", " or ") + ")");

  auto timeout = flags.GetDouble("timeout", 30);
  auto max_message = flags.GetInt("max-message-bytes", 64 << 20);
  if (!timeout.ok()) return Fail(kExitUsage, timeout.status().message());
  if (!max_message.ok()) return Fail(kExitUsage, max_message.status().message());
  if (*timeout <= 0) return Fail(kExitUsage, "--timeout must be positive");
  CallOptions call{flags, *timeout, *max_message, flags.Has("json")};
  return command->run(call);
}
