// dense (with fused leaky ReLUs) and scaled_tanh: reference and finite differences.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

TEST(DenseTest, DenseStackAndScaledTanh) {
  ModelSpec spec = MakeSpec(1, 4, {FlattenL(), DenseL(16), LeakyL(0.3f), DenseL(8), LeakyL(0.01f), DenseL(4),
                                   TanhL(1.2f)}, 4);
  ExpectForwardMatchesReference(spec, 3, 1e-4);
  ExpectGradientsMatchFiniteDifferences(spec, 3);
}

}  // namespace
}  // namespace cosmoflow
