#include "core/nn/spec.h"

#include "core/nn/layer_table.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace cosmoflow {
using nlohmann::json;

const char* LayerTypeName(LayerType t) { return nn_internal::RowOf(t).json_name; }

const char* InputTransformName(InputTransform t) {
  switch (t) {
    case InputTransform::kNone: return "none";
    case InputTransform::kLog1p: return "log1p";
    case InputTransform::kDivideByMean: return "divide_by_mean";
    case InputTransform::kOverdensity: return "overdensity";
  }
  return "?";
}

// ---- uncertainty head ----
const char* UncertaintyHeadName(UncertaintyHead h) {
  switch (h) {
    case UncertaintyHead::kNone: return "none";
    case UncertaintyHead::kGaussian: return "gaussian";
    case UncertaintyHead::kGaussianFull: return "gaussian_full";
  }
  return "?";
}

StatusOr<UncertaintyHead> ParseUncertaintyHead(const std::string& name) {
  for (UncertaintyHead h : {UncertaintyHead::kNone, UncertaintyHead::kGaussian, UncertaintyHead::kGaussianFull}) {
    if (name == UncertaintyHeadName(h)) return h;
  }
  return InvalidArgumentError("unknown uncertainty '" + name + "' (expected none, gaussian or gaussian_full)");
}

int HeadWidth(UncertaintyHead h, int p) {
  switch (h) {
    case UncertaintyHead::kNone: return p;
    case UncertaintyHead::kGaussian: return 2 * p;
    case UncertaintyHead::kGaussianFull: return 2 * p + p * (p - 1) / 2;
  }
  return p;
}
// ---- end uncertainty head ----

namespace {

// What the units of a head are, for error messages: "3 means, 3 log-variances".
std::string HeadLayout(UncertaintyHead h, int p) {
  const std::string n = std::to_string(p);
  if (h == UncertaintyHead::kGaussian) return n + " means, then " + n + " log-variances";
  if (h == UncertaintyHead::kGaussianFull) {
    return n + " means, " + n + " log-diagonal and " + std::to_string(p * (p - 1) / 2) +
           " off-diagonal entries of the precision's Cholesky factor";
  }
  return n + " means";
}
using nn_internal::ActShape;
using nn_internal::RowOf;

std::string LayerLabel(size_t i, LayerType t) {
  return "layer " + std::to_string(i) + " (" + LayerTypeName(t) + ")";
}

}  // namespace

ConvGeometry ConvGeometryFor(int64_t in, int kernel, int stride, bool same_padding) {
  ConvGeometry g;
  if (same_padding) {
    g.out = (in + stride - 1) / stride;
    const int64_t total = std::max<int64_t>((g.out - 1) * stride + kernel - in, 0);
    g.pad_left = total / 2;
    g.pad_right = total - g.pad_left;
  } else {
    g.out = in < kernel ? 0 : (in - kernel) / stride + 1;
  }
  return g;
}

Status ModelSpec::Validate() const {
  if (input_channels <= 0 || input_channels > 64) {
    return InvalidArgumentError("spec '" + name + "': input_channels must be in [1, 64], got " +
                                std::to_string(input_channels));
  }
  if (input_side <= 0 || input_side > 1024) {
    return InvalidArgumentError("spec '" + name + "': input_side must be in [1, 1024], got " +
                                std::to_string(input_side));
  }
  if (outputs.empty()) return InvalidArgumentError("spec '" + name + "': no outputs");
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].name.empty()) {
      return InvalidArgumentError("spec '" + name + "': output " + std::to_string(i) + " has no name");
    }
    if (!(outputs[i].scale != 0.f) || !std::isfinite(outputs[i].scale) || !std::isfinite(outputs[i].offset)) {
      return InvalidArgumentError("spec '" + name + "': output " + std::to_string(i) + " (" + outputs[i].name +
                                  ") needs a finite non-zero scale and finite offset");
    }
  }
  if (layers.empty()) return InvalidArgumentError("spec '" + name + "': no layers");
  ActShape s{input_channels, input_side, false};
  bool has_dense = false;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError("spec '" + name + "': " + LayerLabel(i, l.type) + ": " + why);
    };
    if (static_cast<int>(l.type) < 0 || static_cast<int>(l.type) >= kNumLayerTypes) {
      return InvalidArgumentError("spec '" + name + "': layer " + std::to_string(i) + " has an unknown type");
    }
    const nn_internal::LayerRow& row = RowOf(l.type);
    if (std::string why = row.validate(l, s); !why.empty()) return bad(why);
    if (l.type == LayerType::kScaledTanh && i + 1 != layers.size()) return bad("scaled_tanh must be the last layer");
    has_dense = has_dense || l.type == LayerType::kDense;
    s = row.shape(l, s);
    if (s.features() > (int64_t{1} << 31)) return bad("activation too large");
  }
  if (!s.flat) return InvalidArgumentError("spec '" + name + "': the network must end with flatten + dense");
  // ---- uncertainty head: the last dense layer must be as wide as the head needs ----
  if (!has_dense || s.channels != NetworkOutputs()) {
    if (uncertainty == UncertaintyHead::kNone) {
      return InvalidArgumentError("spec '" + name + "': the last dense layer has " + std::to_string(s.channels) +
                                  " units but the spec names " + std::to_string(outputs.size()) + " outputs");
    }
    return InvalidArgumentError("spec '" + name + "': uncertainty '" + UncertaintyHeadName(uncertainty) +
                                "' with " + std::to_string(outputs.size()) +
                                " outputs needs the last dense layer to have " + std::to_string(NetworkOutputs()) +
                                " units (" + HeadLayout(uncertainty, static_cast<int>(outputs.size())) + "), got " +
                                std::to_string(s.channels));
  }
  if (uncertainty != UncertaintyHead::kNone && outputs.size() > 8) {
    return InvalidArgumentError("spec '" + name + "': uncertainty '" + UncertaintyHeadName(uncertainty) +
                                "' supports at most 8 outputs, the spec names " + std::to_string(outputs.size()));
  }
  if (uncertainty != UncertaintyHead::kNone && layers.back().type == LayerType::kScaledTanh) {
    // A bounded output would bound the log-variances too (sigma within a factor e^1.2 of 1).
    return InvalidArgumentError("spec '" + name + "': uncertainty '" + UncertaintyHeadName(uncertainty) +
                                "' cannot end with scaled_tanh (it would bound the log-variances)");
  }
  // ---- end uncertainty head ----
  return Status::Ok();
}

namespace {

int64_t CountValues(const ModelSpec& spec, bool trainable) {
  ActShape s{spec.input_channels, spec.input_side, false};
  int64_t n = 0;
  for (const LayerSpec& l : spec.layers) {
    for (const auto& rule : RowOf(l.type).params(l, s)) {
      if (rule.trainable != trainable) continue;
      int64_t numel = 1;
      for (int64_t d : rule.shape) numel *= d;
      n += numel;
    }
    s = RowOf(l.type).shape(l, s);
  }
  return n;
}

}  // namespace

int64_t ModelSpec::NumParameters() const { return CountValues(*this, true); }
int64_t ModelSpec::NumStateValues() const { return CountValues(*this, false); }

double ModelSpec::ForwardFlops() const {
  ActShape s{input_channels, input_side, false};
  double f = 0;
  for (const LayerSpec& l : layers) {
    f += RowOf(l.type).flops(l, s);
    s = RowOf(l.type).shape(l, s);
  }
  return f;
}

std::string ModelSpec::ToJson() const {
  json j;
  j["name"] = name;
  j["input_channels"] = input_channels;
  j["input_side"] = input_side;
  j["input_transform"] = InputTransformName(input_transform);
  // ---- uncertainty head: omitted when none, so specs without one keep their JSON ----
  if (uncertainty != UncertaintyHead::kNone) j["uncertainty"] = UncertaintyHeadName(uncertainty);
  // ---- end uncertainty head ----
  j["outputs"] = json::array();
  for (const auto& o : outputs) {
    j["outputs"].push_back({{"name", o.name}, {"unit", o.unit}, {"offset", o.offset}, {"scale", o.scale}});
  }
  j["layers"] = json::array();
  for (const auto& l : layers) {
    json lj;
    lj["type"] = LayerTypeName(l.type);
    RowOf(l.type).to_json(l, &lj);
    j["layers"].push_back(lj);
  }
  return j.dump();
}

namespace {

using nn_internal::FieldReader;

StatusOr<InputTransform> ParseInputTransform(const std::string& name) {
  for (InputTransform t : {InputTransform::kNone, InputTransform::kLog1p, InputTransform::kDivideByMean,
                           InputTransform::kOverdensity}) {
    if (name == InputTransformName(t)) return t;
  }
  return InvalidArgumentError("model spec: unknown input_transform '" + name +
                              "' (expected none, log1p, divide_by_mean or overdensity)");
}

Status ParseOutputs(const json& j, std::vector<OutputSpec>* outputs) {
  auto outs = j.find("outputs");
  if (outs == j.end() || !outs->is_array()) return InvalidArgumentError("model spec: 'outputs' must be an array");
  for (size_t i = 0; i < outs->size(); ++i) {
    const json& o = (*outs)[i];
    const std::string where = "model spec: output " + std::to_string(i);
    if (!o.is_object()) return InvalidArgumentError(where + ": must be an object");
    const FieldReader f(o, where);
    OutputSpec out;
    CF_RETURN_IF_ERROR(f.String("name", &out.name, true));
    CF_RETURN_IF_ERROR(f.String("unit", &out.unit, false));
    CF_RETURN_IF_ERROR(f.Float("offset", &out.offset, false));
    CF_RETURN_IF_ERROR(f.Float("scale", &out.scale, false));
    outputs->push_back(out);
  }
  return Status::Ok();
}

Status ParseLayers(const json& j, std::vector<LayerSpec>* layers) {
  auto ls = j.find("layers");
  if (ls == j.end() || !ls->is_array()) return InvalidArgumentError("model spec: 'layers' must be an array");
  for (size_t i = 0; i < ls->size(); ++i) {
    const json& lj = (*ls)[i];
    const std::string where = "model spec: layer " + std::to_string(i);
    if (!lj.is_object()) return InvalidArgumentError(where + ": must be an object");
    std::string type;
    CF_RETURN_IF_ERROR(FieldReader(lj, where).String("type", &type, true));
    const nn_internal::LayerRow* row = nn_internal::RowByJsonName(type);
    if (row == nullptr) return InvalidArgumentError(where + ": unknown layer type '" + type + "'");
    LayerSpec l;
    l.type = row->type;
    CF_RETURN_IF_ERROR(row->parse(FieldReader(lj, where + " (" + type + ")"), &l));
    layers->push_back(l);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ModelSpec> ModelSpec::FromJson(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("model spec: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError("model spec: top level must be a JSON object");
  ModelSpec s;
  const FieldReader top(j, "model spec");
  CF_RETURN_IF_ERROR(top.String("name", &s.name, false));
  CF_RETURN_IF_ERROR(top.Int("input_channels", &s.input_channels, true));
  CF_RETURN_IF_ERROR(top.Int("input_side", &s.input_side, true));
  std::string transform = "log1p";
  CF_RETURN_IF_ERROR(top.String("input_transform", &transform, false));
  CF_ASSIGN_OR_RETURN(s.input_transform, ParseInputTransform(transform));
  // ---- uncertainty head ----
  std::string uncertainty = "none";
  CF_RETURN_IF_ERROR(top.String("uncertainty", &uncertainty, false));
  auto head = ParseUncertaintyHead(uncertainty);
  if (!head.ok()) return head.status().WithContext("model spec: field 'uncertainty'");
  s.uncertainty = *head;
  // ---- end uncertainty head ----
  CF_RETURN_IF_ERROR(ParseOutputs(j, &s.outputs));
  CF_RETURN_IF_ERROR(ParseLayers(j, &s.layers));
  CF_RETURN_IF_ERROR(s.Validate());
  return s;
}

std::vector<OutputSpec> CosmoFlowOutputs(int num_params) {
  // Ranges of the CosmoFlow parameter draws (the synthetic prior, docs/data.md); H0 follows MLPerf's 70 * (1 +- 0.1).
  std::vector<OutputSpec> all = {
      {"Omega_M", "", 0.30f, 0.05f},
      {"sigma_8", "", 0.865f, 0.085f},
      {"n_s", "", 0.95f, 0.05f},
      {"H0", "km/s/Mpc", 70.f, 7.f},
  };
  num_params = std::clamp(num_params, 1, 4);
  all.resize(num_params);
  return all;
}

namespace {

// Builders for the built-in specs: a layer of `type` with the one or few fields it uses set.
LayerSpec Layer(LayerType type) {
  LayerSpec l;
  l.type = type;
  return l;
}
LayerSpec Conv(int filters, int kernel, int stride, bool same) {
  LayerSpec l = Layer(LayerType::kConv3d);
  l.filters = filters;
  l.kernel = kernel;
  l.stride = stride;
  l.same_padding = same;
  return l;
}
LayerSpec Pool(LayerType t, int size) {
  LayerSpec l = Layer(t);
  l.size = size;
  return l;
}
LayerSpec Leaky(float alpha) {
  LayerSpec l = Layer(LayerType::kLeakyRelu);
  l.alpha = alpha;
  return l;
}
LayerSpec Dropout(float rate) {
  LayerSpec l = Layer(LayerType::kDropout);
  l.rate = rate;
  return l;
}
LayerSpec Flatten() { return Layer(LayerType::kFlatten); }
LayerSpec Dense(int units) {
  LayerSpec l = Layer(LayerType::kDense);
  l.units = units;
  return l;
}
LayerSpec ScaledTanh(float scale) {
  LayerSpec l = Layer(LayerType::kScaledTanh);
  l.scale = scale;
  return l;
}

// SC18 / LBANN CosmoFlow layout, parameterised by width so small64 is the same shape, scaled down.
ModelSpec Sc18Like(const std::string& name, int side, int w, int dense1, int dense2) {
  ModelSpec s;
  s.name = name;
  s.input_channels = 1;
  s.input_side = side;
  s.input_transform = InputTransform::kLog1p;
  s.outputs = CosmoFlowOutputs(3);
  const float a = 0.01f;
  auto& L = s.layers;
  L = {Conv(w, 3, 1, false),     Leaky(a), Pool(LayerType::kAvgPool, 2),
       Conv(2 * w, 4, 1, false), Leaky(a), Pool(LayerType::kAvgPool, 2),
       Conv(4 * w, 4, 1, false), Leaky(a), Pool(LayerType::kAvgPool, 2),
       Conv(8 * w, 3, 2, false), Leaky(a),
       Conv(16 * w, 3, 1, false), Leaky(a),
       Conv(16 * w, 2, 1, false), Leaky(a),
       Conv(16 * w, 2, 1, false), Leaky(a),
       Flatten(), Dropout(0.5f),
       Dense(dense1), Leaky(a), Dropout(0.5f),
       Dense(dense2), Leaky(a),
       Dense(3)};
  return s;
}

ModelSpec MlperfLike(const std::string& name, int side, int w, int blocks, int dense1, int dense2) {
  ModelSpec s;
  s.name = name;
  s.input_channels = 4;
  s.input_side = side;
  s.input_transform = InputTransform::kLog1p;
  s.outputs = CosmoFlowOutputs(4);
  const float a = 0.3f;
  for (int i = 0; i < blocks; ++i) {
    s.layers.push_back(Conv(w << i, 3, 1, true));
    s.layers.push_back(Leaky(a));
    s.layers.push_back(Pool(LayerType::kMaxPool, 2));
  }
  s.layers.push_back(Flatten());
  s.layers.push_back(Dense(dense1));
  s.layers.push_back(Leaky(a));
  s.layers.push_back(Dropout(0.5f));
  s.layers.push_back(Dense(dense2));
  s.layers.push_back(Leaky(a));
  s.layers.push_back(Dropout(0.5f));
  s.layers.push_back(Dense(4));
  s.layers.push_back(ScaledTanh(1.2f));
  return s;
}

}  // namespace

StatusOr<ModelSpec> BuiltinSpec(const std::string& name) {
  if (name == "sc18") return Sc18Like("sc18", 128, 16, 2048, 256);
  // small64: 64^3 -> 62 -> 31 -> 28 -> 14 -> 11 -> 5 -> (stride 2) 2 ... too small for the tail, so
  // the scaled-down variant keeps the first three blocks and a shorter tail.
  if (name == "small64") {
    ModelSpec s;
    s.name = "small64";
    s.input_channels = 1;
    s.input_side = 64;
    s.input_transform = InputTransform::kLog1p;
    s.outputs = CosmoFlowOutputs(3);
    const float a = 0.01f;
    // 64 -> conv3 62 -> pool 31 -> conv4 28 -> pool 14 -> conv4 11 -> pool 5 -> conv3 3 -> conv2 2
    s.layers = {Conv(16, 3, 1, false), Leaky(a), Pool(LayerType::kAvgPool, 2),
                Conv(16, 4, 1, false), Leaky(a), Pool(LayerType::kAvgPool, 2),
                Conv(32, 4, 1, false), Leaky(a), Pool(LayerType::kAvgPool, 2),
                Conv(64, 3, 1, false), Leaky(a),
                Conv(64, 2, 1, false), Leaky(a),
                Flatten(), Dropout(0.2f),
                Dense(256), Leaky(a), Dropout(0.2f),
                Dense(64), Leaky(a),
                Dense(3)};
    return s;
  }
  if (name == "tiny32") {
    ModelSpec s;
    s.name = "tiny32";
    s.input_channels = 1;
    s.input_side = 32;
    s.input_transform = InputTransform::kLog1p;
    s.outputs = CosmoFlowOutputs(3);
    const float a = 0.01f;
    // 32 -> conv3 30 -> avg 15 -> conv4 12 -> max 6 -> conv3 s2 same 3 -> flatten 16*27=432.
    // Channel counts are multiples of 16 so every oneDNN pass has a real (jit) kernel in fp32 and
    // bf16 (oneDNN 2.6 has no jit bf16 backward-data for fewer than 16 input channels).
    s.layers = {Conv(16, 3, 1, false), Leaky(a), Pool(LayerType::kAvgPool, 2),
                Conv(16, 4, 1, false), Leaky(a), Pool(LayerType::kMaxPool, 2),
                Conv(16, 3, 2, true),  Leaky(a),
                Flatten(), Dense(32), Leaky(a), Dropout(0.1f),
                Dense(3)};
    return s;
  }
  if (name == "mlperf") return MlperfLike("mlperf", 128, 32, 5, 128, 64);
  // mlperf64: 4x64^3, 5 blocks -> 2^3 x 512 = 4096 features, same dense tail.
  if (name == "mlperf64") return MlperfLike("mlperf64", 64, 32, 5, 128, 64);
  return NotFoundError("unknown built-in model spec '" + name + "' (known: sc18, mlperf, tiny32, small64, mlperf64)");
}

std::vector<std::string> BuiltinSpecNames() { return {"sc18", "mlperf", "tiny32", "small64", "mlperf64"}; }

namespace {
template <typename T>
void TransformImpl(InputTransform t, const T* src, int64_t n, int64_t voxels_per_channel, float* dst) {
  switch (t) {
    case InputTransform::kNone:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
      break;
    case InputTransform::kLog1p:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::log1p(static_cast<float>(src[i]));
      break;
    case InputTransform::kDivideByMean:
    case InputTransform::kOverdensity: {
      // overdensity = x / mean - 1: the same information centred on zero.
      const float shift = t == InputTransform::kOverdensity ? 1.f : 0.f;
      int64_t vpc = voxels_per_channel > 0 ? voxels_per_channel : n;
      for (int64_t start = 0; start < n; start += vpc) {
        int64_t end = std::min(n, start + vpc);
        double sum = 0;
        for (int64_t i = start; i < end; ++i) sum += static_cast<double>(src[i]);
        double mean = sum / static_cast<double>(end - start);
        // An empty channel stays zero (divide_by_mean) or -1 (overdensity) rather than NaN.
        float inv = mean > 0 ? static_cast<float>(1.0 / mean) : 0.f;
        for (int64_t i = start; i < end; ++i) dst[i] = static_cast<float>(src[i]) * inv - shift;
      }
      break;
    }
  }
}
}  // namespace

void ApplyInputTransform(InputTransform t, const int16_t* counts, int64_t n, int64_t voxels_per_channel,
                         float* dst) {
  if (t == InputTransform::kLog1p) {
    // log1p of every int16 value, computed once (256 KiB, stays in L2): a scalar std::log1p per
    // voxel costs a sizeable fraction of a forward pass per cube, the table a few percent of that.
    // The server (per batch) and the trainer's loader both use it; same bits.
    static const std::vector<float> table = [] {
      std::vector<float> v(65536);
      for (int i = -32768; i <= 32767; ++i) v[i + 32768] = std::log1p(static_cast<float>(i));
      return v;
    }();
    const float* lut = table.data() + 32768;
    for (int64_t i = 0; i < n; ++i) dst[i] = lut[counts[i]];
    return;
  }
  TransformImpl(t, counts, n, voxels_per_channel, dst);
}
void ApplyInputTransform(InputTransform t, const float* values, int64_t n, int64_t voxels_per_channel,
                         float* dst) {
  TransformImpl(t, values, n, voxels_per_channel, dst);
}

StatusOr<ModelSpec> LoadSpec(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(spec, ec)) {
    std::ifstream in(spec);
    std::stringstream ss;
    ss << in.rdbuf();
    auto parsed = ModelSpec::FromJson(ss.str());
    if (!parsed.ok()) return parsed.status().WithContext(spec);
    Status v = parsed->Validate();
    if (!v.ok()) return v.WithContext(spec);
    return parsed;
  }
  auto builtin = BuiltinSpec(spec);
  if (!builtin.ok()) {
    return InvalidArgumentError(spec + ": neither a spec file nor a built-in model (" +
                                builtin.status().message() + ")");
  }
  return builtin;
}

}  // namespace cosmoflow
