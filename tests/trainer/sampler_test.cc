#include "trainer/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace cosmoflow {
namespace {

TEST(EpochSamplerTest, TwoRanksOfBatchBSeeTheSamplesOfOneRankOfBatch2B) {
  auto one = EpochSampler::Create(37, 1, 0, 8, 42, ShuffleMode::kGlobal);
  auto r0 = EpochSampler::Create(37, 2, 0, 4, 42, ShuffleMode::kGlobal);
  auto r1 = EpochSampler::Create(37, 2, 1, 4, 42, ShuffleMode::kGlobal);
  ASSERT_TRUE(one.ok() && r0.ok() && r1.ok());
  EXPECT_EQ(one->steps_per_epoch(), 4);  // floor(37 / 8)
  EXPECT_EQ(r0->steps_per_epoch(), 4);
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int s = 0; s < 4; ++s) {
      auto all = one->LocalBatch(epoch, s);
      auto a = r0->LocalBatch(epoch, s), b = r1->LocalBatch(epoch, s);
      a.insert(a.end(), b.begin(), b.end());
      EXPECT_EQ(all, a) << "epoch " << epoch << " step " << s;
    }
  }
}

TEST(EpochSamplerTest, EpochIsAPermutationWithoutRepeatsAndReshufflesEachEpoch) {
  auto s = EpochSampler::Create(40, 1, 0, 10, 7, ShuffleMode::kGlobal);
  ASSERT_TRUE(s.ok());
  std::vector<int64_t> e0, e1;
  for (int k = 0; k < 4; ++k) {
    auto b = s->LocalBatch(0, k);
    e0.insert(e0.end(), b.begin(), b.end());
    b = s->LocalBatch(1, k);
    e1.insert(e1.end(), b.begin(), b.end());
  }
  std::set<int64_t> unique(e0.begin(), e0.end());
  EXPECT_EQ(unique.size(), 40u);
  EXPECT_EQ(*unique.begin(), 0);
  EXPECT_EQ(*unique.rbegin(), 39);
  EXPECT_NE(e0, e1) << "epochs must be reshuffled";
  // Same seed, same order; another seed, another order.
  auto again = EpochSampler::Create(40, 1, 0, 10, 7, ShuffleMode::kGlobal);
  auto other = EpochSampler::Create(40, 1, 0, 10, 8, ShuffleMode::kGlobal);
  EXPECT_EQ(again->LocalBatch(0, 0), s->LocalBatch(0, 0));
  EXPECT_NE(other->LocalBatch(0, 0), s->LocalBatch(0, 0));
}

TEST(EpochSamplerTest, ShardModeKeepsEachRankInsideItsBlock) {
  for (int rank = 0; rank < 3; ++rank) {
    auto s = EpochSampler::Create(31, 3, rank, 2, 5, ShuffleMode::kShard);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->steps_per_epoch(), 5);  // floor(floor(31/3) / 2)
    auto mine = s->SamplesOfThisRank();
    std::set<int64_t> block(mine.begin(), mine.end());
    for (int e = 0; e < 2; ++e) {
      for (int k = 0; k < s->steps_per_epoch(); ++k) {
        for (int64_t i : s->LocalBatch(e, k))
          EXPECT_TRUE(block.count(i)) << "rank " << rank << " read " << i;
      }
    }
  }
}

TEST(EpochSamplerTest, TooSmallDatasetIsAnError) {
  auto s = EpochSampler::Create(5, 2, 0, 4, 1, ShuffleMode::kGlobal);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("fewer than one global batch of 8"), std::string::npos)
      << s.status().message();
  EXPECT_FALSE(EpochSampler::Create(5, 2, 2, 1, 1, ShuffleMode::kGlobal).ok());
}

}  // namespace
}  // namespace cosmoflow
