#include "core/nn/layer_table.h"

#include <array>
#include <cmath>

#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using nlohmann::json;

// ---- field readers ----

std::string Missing(const std::string& where, const char* key) { return where + ": missing field '" + key + "'"; }

}  // namespace

Status FieldReader::Int(const char* key, int* out, bool required) const {
  auto it = o_.find(key);
  if (it == o_.end()) return required ? InvalidArgumentError(Missing(where_, key)) : Status::Ok();
  if (!it->is_number_integer()) return InvalidArgumentError(where_ + ": field '" + key + "' must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < -(int64_t{1} << 30) || v > (int64_t{1} << 30)) {
    return InvalidArgumentError(where_ + ": field '" + key + "' out of range");
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status FieldReader::Float(const char* key, float* out, bool required) const {
  auto it = o_.find(key);
  if (it == o_.end()) return required ? InvalidArgumentError(Missing(where_, key)) : Status::Ok();
  if (!it->is_number()) return InvalidArgumentError(where_ + ": field '" + key + "' must be a number");
  *out = it->get<float>();
  return Status::Ok();
}

Status FieldReader::String(const char* key, std::string* out, bool required) const {
  auto it = o_.find(key);
  if (it == o_.end()) return required ? InvalidArgumentError(Missing(where_, key)) : Status::Ok();
  if (!it->is_string()) return InvalidArgumentError(where_ + ": field '" + key + "' must be a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

namespace {

// ---- shared pieces of the rows ----

ActShape Same(const LayerSpec&, const ActShape& in) { return in; }
std::vector<ParamRule> NoParams(const LayerSpec&, const ActShape&) { return {}; }
double NoFlops(const LayerSpec&, const ActShape&) { return 0; }
Status NoFields(const FieldReader&, LayerSpec*) { return Status::Ok(); }
void NoJson(const LayerSpec&, json*) {}

// ---- conv3d ----

Status ParseConv(const FieldReader& f, LayerSpec* l) {
  CF_RETURN_IF_ERROR(f.Int("filters", &l->filters, true));
  CF_RETURN_IF_ERROR(f.Int("kernel", &l->kernel, true));
  CF_RETURN_IF_ERROR(f.Int("stride", &l->stride, false));
  std::string pad = "valid";
  CF_RETURN_IF_ERROR(f.String("padding", &pad, false));
  if (pad != "valid" && pad != "same") {
    return InvalidArgumentError(f.where() + ": padding must be 'valid' or 'same', got '" + pad + "'");
  }
  l->same_padding = pad == "same";
  return Status::Ok();
}
void ConvJson(const LayerSpec& l, json* j) {
  (*j)["filters"] = l.filters;
  (*j)["kernel"] = l.kernel;
  (*j)["stride"] = l.stride;
  (*j)["padding"] = l.same_padding ? "same" : "valid";
}
int64_t ConvOut(const LayerSpec& l, const ActShape& in) {
  return ConvGeometryFor(in.side, l.kernel, l.stride, l.same_padding).out;
}
std::string ValidateConv(const LayerSpec& l, const ActShape& in) {
  if (in.flat) return "conv3d after flatten";
  if (l.filters <= 0) return "filters must be positive, got " + std::to_string(l.filters);
  if (l.kernel <= 0) return "kernel must be positive, got " + std::to_string(l.kernel);
  if (l.stride <= 0) return "stride must be positive, got " + std::to_string(l.stride);
  if (!l.same_padding && l.kernel > in.side) {
    return "kernel " + std::to_string(l.kernel) + " larger than input side " + std::to_string(in.side);
  }
  if (ConvOut(l, in) <= 0) return "output side is zero";
  return "";
}
ActShape ConvShape(const LayerSpec& l, const ActShape& in) { return {l.filters, ConvOut(l, in), false}; }
std::vector<ParamRule> ConvParams(const LayerSpec& l, const ActShape& in) {
  return {{"weights", {l.filters, in.channels, l.kernel, l.kernel, l.kernel}, ParamInit::kHeUniform, true},
          {"bias", {l.filters}, ParamInit::kZeros, true}};
}
double ConvFlops(const LayerSpec& l, const ActShape& in) {
  const double out = static_cast<double>(ConvOut(l, in));
  return 2.0 * l.kernel * l.kernel * l.kernel * in.channels * l.filters * out * out * out;
}

// ---- pools ----

Status ParsePool(const FieldReader& f, LayerSpec* l) { return f.Int("size", &l->size, true); }
void PoolJson(const LayerSpec& l, json* j) { (*j)["size"] = l.size; }
std::string ValidatePool(const LayerSpec& l, const ActShape& in) {
  if (in.flat) return "pooling after flatten";
  if (l.size <= 0) return "size must be positive, got " + std::to_string(l.size);
  if (l.size > in.side) {
    return "window " + std::to_string(l.size) + " larger than input side " + std::to_string(in.side);
  }
  return "";
}
ActShape PoolShape(const LayerSpec& l, const ActShape& in) { return {in.channels, in.side / l.size, false}; }

// ---- element-wise layers ----

Status ParseLeaky(const FieldReader& f, LayerSpec* l) { return f.Float("alpha", &l->alpha, true); }
void LeakyJson(const LayerSpec& l, json* j) { (*j)["alpha"] = l.alpha; }
std::string ValidateLeaky(const LayerSpec& l, const ActShape&) {
  return l.alpha >= 0.f && l.alpha < 1.f ? "" : "alpha must be in [0, 1)";
}

Status ParseDropout(const FieldReader& f, LayerSpec* l) { return f.Float("rate", &l->rate, true); }
void DropoutJson(const LayerSpec& l, json* j) { (*j)["rate"] = l.rate; }
std::string ValidateDropout(const LayerSpec& l, const ActShape&) {
  return l.rate >= 0.f && l.rate < 1.f ? "" : "rate must be in [0, 1)";
}

Status ParseTanh(const FieldReader& f, LayerSpec* l) { return f.Float("scale", &l->scale, true); }
void TanhJson(const LayerSpec& l, json* j) { (*j)["scale"] = l.scale; }
std::string ValidateTanh(const LayerSpec& l, const ActShape&) {
  return l.scale > 0.f && std::isfinite(l.scale) ? "" : "scale must be positive";
}

// ---- flatten and dense ----

std::string ValidateFlatten(const LayerSpec&, const ActShape& in) { return in.flat ? "flatten twice" : ""; }
ActShape FlattenShape(const LayerSpec&, const ActShape& in) { return {in.features(), 1, true}; }

Status ParseDense(const FieldReader& f, LayerSpec* l) { return f.Int("units", &l->units, true); }
void DenseJson(const LayerSpec& l, json* j) { (*j)["units"] = l.units; }
std::string ValidateDense(const LayerSpec& l, const ActShape& in) {
  if (!in.flat) return "dense before flatten";
  if (l.units <= 0) return "units must be positive, got " + std::to_string(l.units);
  return "";
}
ActShape DenseShape(const LayerSpec& l, const ActShape&) { return {l.units, 1, true}; }
std::vector<ParamRule> DenseParams(const LayerSpec& l, const ActShape& in) {
  return {{"weights", {l.units, in.features()}, ParamInit::kHeUniform, true},
          {"bias", {l.units}, ParamInit::kZeros, true}};
}
double DenseFlops(const LayerSpec& l, const ActShape& in) { return 2.0 * in.features() * l.units; }

// ---- batch_norm ----

Status ParseBatchNorm(const FieldReader& f, LayerSpec* l) {
  CF_RETURN_IF_ERROR(f.Float("momentum", &l->momentum, false));
  return f.Float("epsilon", &l->epsilon, false);
}
void BatchNormJson(const LayerSpec& l, json* j) {
  (*j)["momentum"] = l.momentum;
  (*j)["epsilon"] = l.epsilon;
}
std::string ValidateBatchNorm(const LayerSpec& l, const ActShape&) {
  if (!(l.momentum >= 0.f && l.momentum <= 1.f)) return "momentum must be in [0, 1]";
  if (!(l.epsilon > 0.f) || !std::isfinite(l.epsilon)) return "epsilon must be positive and finite";
  return "";
}
std::vector<ParamRule> BatchNormParams(const LayerSpec&, const ActShape& in) {
  return {{"gamma", {in.channels}, ParamInit::kOnes, true},
          {"beta", {in.channels}, ParamInit::kZeros, true},
          {"running_mean", {in.channels}, ParamInit::kZeros, false},
          {"running_var", {in.channels}, ParamInit::kOnes, false}};
}

// ---- the table: one row per LayerType, in enum order ----

constexpr std::array<LayerRow, kNumLayerTypes> kRows = {{
    {LayerType::kConv3d, "conv3d", "conv", "conv", ParseConv, ConvJson, ValidateConv, ConvShape, ConvParams, ConvFlops,
     MakeConv3dOp, true},
    {LayerType::kAvgPool, "avg_pool", "avg_pool", "pool", ParsePool, PoolJson, ValidatePool, PoolShape, NoParams,
     NoFlops, MakePoolOp, false},
    {LayerType::kMaxPool, "max_pool", "max_pool", "pool", ParsePool, PoolJson, ValidatePool, PoolShape, NoParams,
     NoFlops, MakePoolOp, false},
    {LayerType::kLeakyRelu, "leaky_relu", "leaky", "leaky", ParseLeaky, LeakyJson, ValidateLeaky, Same, NoParams,
     NoFlops, MakeLeakyReluOp, false},
    {LayerType::kDropout, "dropout", "dropout", "dropout", ParseDropout, DropoutJson, ValidateDropout, Same, NoParams,
     NoFlops, MakeDropoutOp, false},
    {LayerType::kFlatten, "flatten", "flatten", "flatten", NoFields, NoJson, ValidateFlatten, FlattenShape, NoParams,
     NoFlops, nullptr, false},
    {LayerType::kDense, "dense", "dense", "dense", ParseDense, DenseJson, ValidateDense, DenseShape, DenseParams,
     DenseFlops, MakeDenseOp, true},
    {LayerType::kScaledTanh, "scaled_tanh", "scaled_tanh", "scaled_tanh", ParseTanh, TanhJson, ValidateTanh, Same,
     NoParams, NoFlops, MakeScaledTanhOp, false},
    {LayerType::kBatchNorm, "batch_norm", "bn", "bn", ParseBatchNorm, BatchNormJson, ValidateBatchNorm, Same,
     BatchNormParams, NoFlops, MakeBatchNormOp, false},
}};

constexpr bool RowsInEnumOrder() {
  for (size_t i = 0; i < kRows.size(); ++i) {
    if (static_cast<size_t>(kRows[i].type) != i) return false;
  }
  return true;
}
static_assert(RowsInEnumOrder(), "layer table rows must follow the LayerType enum, one row per type");

}  // namespace

const LayerRow& RowOf(LayerType type) { return kRows[static_cast<size_t>(type)]; }

const LayerRow* RowByJsonName(const std::string& name) {
  for (const LayerRow& r : kRows) {
    if (name == r.json_name) return &r;
  }
  return nullptr;
}

}  // namespace cosmoflow::nn_internal
