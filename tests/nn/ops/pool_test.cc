// avg_pool / max_pool (and a leaky ReLU after a pool, which no conv absorbs): forward against the
// naive reference, backward against finite differences.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

ModelSpec PoolCase(int side, std::vector<LayerSpec> layers, int outputs) {
  std::vector<LayerSpec> all = {ConvL(2, 2)};
  all.insert(all.end(), layers.begin(), layers.end());
  all.push_back(FlattenL());
  all.push_back(DenseL(outputs));
  return MakeSpec(2, side, all, outputs);
}

TEST(PoolTest, MatchesReferenceAndFiniteDifferences) {
  const std::pair<const char*, std::pair<int, std::vector<LayerSpec>>> cases[] = {
      {"avg_pool2_odd", {8, {PoolL(false, 2)}}},  // 7 -> 3: the trailing plane is dropped
      {"max_pool2", {9, {PoolL(true, 2)}}},
      {"leaky_after_pool", {9, {PoolL(false, 2), LeakyL(0.2f)}}},
  };
  for (const auto& [name, c] : cases) {
    SCOPED_TRACE(name);
    ExpectForwardMatchesReference(PoolCase(c.first, c.second, 5), 2, 1e-4);
    ExpectGradientsMatchFiniteDifferences(PoolCase(c.first, c.second, 3), 2);
  }
}

}  // namespace
}  // namespace cosmoflow
