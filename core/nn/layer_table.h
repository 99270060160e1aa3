// The layer table: one row per LayerType, the one place that knows what a layer type is.
//
// A row gives the type's JSON name and fields, its validation against the incoming activation
// shape, how it changes that shape, the trainable tensors it owns (shape and init rule), its
// forward FLOPs and the factory of its op (core/nn/ops/). ModelSpec's JSON, Validate,
// NumParameters and ForwardFlops and the network's Build all walk the layers through this table,
// so adding a layer type is one op file, one row here and one test file. A static_assert in
// layer_table.cc keeps the rows in the order of the LayerType enum.
//
// Internal to core/nn (not part of the public contract).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/spec.h"

namespace cosmoflow::nn_internal {

class Op;
struct OpArgs;

// The activation shape between layers (per sample). After flatten or dense the tensor is a flat
// vector of `channels` features.
struct ActShape {
  int64_t channels = 0;
  int64_t side = 0;
  bool flat = false;
  int64_t features() const { return flat ? channels : channels * side * side * side; }
};

enum class ParamInit {
  kHeUniform,  // uniform in +-sqrt(6 / fan_in), fan_in = product of all dims but the first
  kZeros,
  kOnes,
};

// A tensor a layer owns: trainable (optimised, allreduced) or state (saved and loaded, not
// optimised: batch norm's running statistics).
struct ParamRule {
  std::string suffix;  // "weights", "bias", "gamma", ...: the tensor is "<op name>.<suffix>"
  std::vector<int64_t> shape;
  ParamInit init = ParamInit::kZeros;
  bool trainable = true;
};

// Reads one JSON layer object's fields into a LayerSpec; errors name the field.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& object, std::string where) : o_(object), where_(std::move(where)) {}
  Status Int(const char* key, int* out, bool required) const;
  Status Float(const char* key, float* out, bool required) const;
  Status String(const char* key, std::string* out, bool required) const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& o_;
  std::string where_;
};

using OpFactory = std::unique_ptr<Op> (*)(OpArgs& args);

struct LayerRow {
  LayerType type;
  const char* json_name;
  // Op and parameter names are "<name_prefix><n>", n counted per counter_key over the network.
  const char* name_prefix;
  const char* counter_key;
  Status (*parse)(const FieldReader& fields, LayerSpec* layer);
  void (*to_json)(const LayerSpec& layer, nlohmann::json* object);
  // Empty when the layer fits `in`, else why not (the caller names the layer).
  std::string (*validate)(const LayerSpec& layer, const ActShape& in);
  ActShape (*shape)(const LayerSpec& layer, const ActShape& in);  // assumes validate passed
  std::vector<ParamRule> (*params)(const LayerSpec& layer, const ActShape& in);
  double (*flops)(const LayerSpec& layer, const ActShape& in);  // per sample, multiply-add = 2
  // The op of this layer, or nullptr where the layer needs none (flatten; dropout at inference).
  OpFactory make_op;
  // conv3d and dense fold a following leaky_relu into their primitive.
  bool absorbs_next_leaky;
};

const LayerRow& RowOf(LayerType type);
// Nullptr for an unknown name.
const LayerRow* RowByJsonName(const std::string& name);

}  // namespace cosmoflow::nn_internal
