// SelectMembers (trainer/uncertainty_run.h): which members an ensemble keeps.
#include "trainer/uncertainty_run.h"

#include <gtest/gtest.h>

namespace cosmoflow {
namespace {

// A member whose means miss the truths by `error` on every output of every sample.
ValidationPosteriors Member(double error, int n = 4, int p = 3) {
  ValidationPosteriors v;
  for (int i = 0; i < n; ++i) {
    v.index.push_back(i);
    for (int k = 0; k < p; ++k) {
      v.truth.push_back(0.1 * i - 0.05 * k);
      v.mean.push_back(v.truth.back() + (i % 2 ? error : -error));
    }
  }
  return v;
}

TEST(SelectMembersTest, LeavesOutAMemberFarWorseThanTheMedian) {
  const ModelSpec spec = *BuiltinSpec("tiny32");
  std::vector<double> errors;
  // Errors 0.1, 0.2 (2x the median's in RMS: 4x in MSE), 0.11: the second is left out.
  auto kept = SelectMembers(spec, {Member(0.1), Member(0.2), Member(0.11)}, 1.5, &errors);
  EXPECT_EQ(kept, (std::vector<int>{0, 2}));
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_NEAR(errors[0], 3 * 0.01, 1e-12);  // summed over the 3 outputs, averaged over samples
  EXPECT_NEAR(errors[1], 3 * 0.04, 1e-12);
  // Within the ratio: all kept; ratio 0: all kept whatever they are.
  EXPECT_EQ(SelectMembers(spec, {Member(0.1), Member(0.11), Member(0.12)}, 1.5, &errors).size(), 3u);
  EXPECT_EQ(SelectMembers(spec, {Member(0.1), Member(1.0), Member(0.1)}, 0, &errors).size(), 3u);
  // One member: always kept.
  EXPECT_EQ(SelectMembers(spec, {Member(5.0)}, 1.5, &errors), (std::vector<int>{0}));
  // Two members: the median is their mean, so a much worse one is still left out.
  EXPECT_EQ(SelectMembers(spec, {Member(0.1), Member(0.5)}, 1.5, &errors), (std::vector<int>{0}));
}

}  // namespace
}  // namespace cosmoflow
