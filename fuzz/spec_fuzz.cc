// Fuzz target: the model-spec JSON parser (ModelSpec::FromJson, which validates the whole layer
// walk). Properties: no crash, no sanitizer report, no uncaught exception (nlohmann::json throws:
// FromJson must turn every throw into a status); an accepted spec survives a round trip through
// ToJson unchanged.
#include "core/nn/spec.h"
#include "fuzz/fuzz_util.h"

using namespace cosmoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;  // specs are small; longer inputs only slow the search
  auto spec = ModelSpec::FromJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!spec.ok()) return 0;
  const std::string json = spec->ToJson();
  auto again = ModelSpec::FromJson(json);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->ToJson() == json);
  return 0;
}
