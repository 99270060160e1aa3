// Runs under `mpirun -np 2`: gradient averaging on fused buckets (grad_allreducer.cc) and the
// agreement helpers (mpi_util.cc), on real MPI ranks. Each rank runs the same GoogleTest cases; a
// failure on any rank fails mpirun.
#include <gtest/gtest.h>
#include <mpi.h>

#include "trainer/grad_allreducer.h"
#include "trainer/mpi_util.h"

namespace cosmoflow {
namespace {

int Rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int Size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

struct FakeParams {
  std::vector<std::vector<float>> values, grads;
  std::vector<Parameter> params;
  explicit FakeParams(const std::vector<int64_t>& sizes) {
    values.resize(sizes.size());
    grads.resize(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      values[i].assign(sizes[i], 0.f);
      grads[i].assign(sizes[i], 0.f);
      Parameter p;
      p.name = "p" + std::to_string(i);
      p.shape = {sizes[i]};
      p.value = values[i].data();
      p.grad = grads[i].data();
      params.push_back(p);
    }
  }
};

class GradientAllreducerTest : public ::testing::TestWithParam<GradientAllreducer::Mode> {};

TEST_P(GradientAllreducerTest, AveragesEveryGradientAcrossRanksInSeveralBuckets) {
  // 40 KB buckets: the 12000-float tensor gets a bucket of its own, the small ones share.
  FakeParams f({100, 12000, 7, 3000, 1, 5000});
  GradientAllreducer reducer(&f.params, MPI_COMM_WORLD, 40000, GetParam());
  EXPECT_GE(reducer.num_buckets(), 3);
  EXPECT_EQ(reducer.total_bytes(), 4 * (100 + 12000 + 7 + 3000 + 1 + 5000));
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < f.grads.size(); ++i) {
      for (size_t j = 0; j < f.grads[i].size(); ++j) {
        f.grads[i][j] = static_cast<float>((Rank() + 1) * (j % 13) + i + step);
      }
    }
    reducer.BeginStep();
    // Backward finishes parameters in reverse order.
    for (int i = static_cast<int>(f.params.size()) - 1; i >= 0; --i) reducer.OnGradReady(i);
    reducer.FinishStep();
    const int n = Size();
    const float mean_factor = static_cast<float>(n + 1) / 2.f;  // mean of (rank + 1)
    for (size_t i = 0; i < f.grads.size(); ++i) {
      for (size_t j = 0; j < f.grads[i].size(); j += 97) {
        const float expect = mean_factor * (j % 13) + i + step;
        ASSERT_FLOAT_EQ(f.grads[i][j], expect)
            << "param " << i << " element " << j << " step " << step;
      }
    }
    EXPECT_GE(reducer.last_wait_seconds(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GradientAllreducerTest,
                         ::testing::Values(GradientAllreducer::Mode::kThread,
                                           GradientAllreducer::Mode::kNonblocking));

TEST(MpiUtilTest, AnErrorOnOneRankReachesEveryRank) {
  Status mine = Rank() == 1 ? NotFoundError("/data/x.h5: no such file") : Status::Ok();
  Status agreed = AgreeOnStatus(mine, MPI_COMM_WORLD);
  if (Size() == 1) {
    EXPECT_TRUE(agreed.ok());
    return;
  }
  ASSERT_FALSE(agreed.ok());
  EXPECT_EQ(agreed.code(), StatusCode::kNotFound);
  EXPECT_EQ(agreed.message(), "rank 1: /data/x.h5: no such file");
  EXPECT_TRUE(AgreeOnStatus(Status::Ok(), MPI_COMM_WORLD).ok());
}

TEST(MpiUtilTest, FlagsChecksumsAndGathers) {
  EXPECT_TRUE(AnyRankTrue(Rank() == Size() - 1, MPI_COMM_WORLD));
  EXPECT_FALSE(AnyRankTrue(false, MPI_COMM_WORLD));
  EXPECT_TRUE(SameOnAllRanks(0xdeadbeef, MPI_COMM_WORLD));
  if (Size() > 1) {
    EXPECT_FALSE(SameOnAllRanks(static_cast<uint32_t>(Rank()), MPI_COMM_WORLD));
  }
  std::vector<float> mine(Rank() + 1, static_cast<float>(Rank()));
  auto all = GatherToRoot(mine, MPI_COMM_WORLD);
  if (Rank() == 0) {
    ASSERT_EQ(all.size(), static_cast<size_t>(Size() * (Size() + 1) / 2));
    EXPECT_EQ(all.back(), static_cast<float>(Size() - 1));
  } else {
    EXPECT_TRUE(all.empty());
  }
  std::vector<double> sums = {1.0, static_cast<double>(Rank())};
  AllreduceSum(sums, MPI_COMM_WORLD);
  EXPECT_EQ(sums[0], Size());
}

}  // namespace
}  // namespace cosmoflow

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0) {
    // Keep one copy of the report; failures on other ranks still print and set the exit code.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
