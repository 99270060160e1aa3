// The layer table: every LayerType has a row (also a static_assert in layer_table.cc), its JSON
// name round-trips, and an unknown type is refused by name.
#include "core/nn/layer_table.h"

#include <gtest/gtest.h>

namespace cosmoflow {
namespace {

TEST(LayerTableTest, EveryTypeHasItsRowAndName) {
  for (int i = 0; i < kNumLayerTypes; ++i) {
    const auto type = static_cast<LayerType>(i);
    const nn_internal::LayerRow& row = nn_internal::RowOf(type);
    EXPECT_EQ(row.type, type);
    const nn_internal::LayerRow* by_name = nn_internal::RowByJsonName(row.json_name);
    ASSERT_NE(by_name, nullptr) << row.json_name;
    EXPECT_EQ(by_name->type, type);
    EXPECT_STREQ(LayerTypeName(type), row.json_name);
  }
  EXPECT_EQ(nn_internal::RowByJsonName("batchnorm"), nullptr);
}

TEST(LayerTableTest, UnknownLayerTypeIsRefusedByName) {
  auto r = ModelSpec::FromJson(R"({"input_channels": 1, "input_side": 4, "outputs": [{"name": "a"}],
      "layers": [{"type": "conv4d", "filters": 1, "kernel": 1}, {"type": "flatten"}, {"type": "dense", "units": 1}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer 0: unknown layer type 'conv4d'"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace cosmoflow
