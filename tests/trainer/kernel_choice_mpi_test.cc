// Runs under `mpirun -np 2`: with kernel selection by measurement every rank runs rank 0's kernels
// (CreateNetworkOnEveryRank), even when the ranks' own timings disagree. Each rank gets its own
// cache file with planted figures: rank 0's make the FFT kernels fastest, rank 1's oneDNN's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "core/nn/network.h"
#include "tests/common/files.h"
#include "tests/nn/test_util.h"
#include "trainer/mpi_util.h"

namespace cosmoflow {
namespace {

// Two convs (3^3 and 2^3) and a dense head: passes with FFT and direct candidates.
ModelSpec ConvSpec() {
  using namespace cosmoflow::testing;  // NOLINT
  return MakeSpec(2, 10, {ConvL(16, 3), ConvL(16, 2), FlattenL(), DenseL(3)}, 3);
}

NetworkOptions Measured(const std::string& cache) {
  NetworkOptions o;
  o.batch = 2;
  o.training = true;
  o.kernel_selection = KernelSelection::kMeasure;
  o.kernel_cache = cache;
  return o;
}

// Every timing in `path` set to 1 s but `fast`'s, set to 1 us.
void Plant(const std::string& path, const std::string& fast) {
  std::ifstream in(path);
  std::string line, text;
  while (std::getline(in, line)) {
    const size_t a = line.find('\t'), b = line.find('\t', a + 1);
    const std::string candidate = line.substr(a + 1, b - a - 1);
    text += line.substr(0, b) + (candidate == fast ? "\t1e-6\n" : "\t1\n");
  }
  std::ofstream(path, std::ios::trunc) << text;
}

size_t Count(const Network& net, const std::string& kernel) {
  size_t n = 0;
  for (const auto& k : net.ChosenKernels()) n += k.op.rfind("conv", 0) == 0 && k.kernel == kernel;
  return n;
}

TEST(KernelChoiceMpiTest, EveryRankRunsRankZerosMeasuredChoice) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 2) << "run under mpirun -np 2";
  testing::TempDir dir("kernel-choice-rank" + std::to_string(rank));
  const std::string cache = dir.path() + "/timings.tsv";
  // Each rank times on its own, then plants its figures.
  auto alone = Network::Create(ConvSpec(), Measured(cache));
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  Plant(cache, rank == 0 ? "fft" : "onednn");
  auto own = Network::Create(ConvSpec(), Measured(cache));
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  // Both ranks skip, or neither (a lone rank would wait in the collectives below).
  if (BroadcastString(Count(**own, "fft") > 0 ? "fft" : "", MPI_COMM_WORLD).empty()) {
    GTEST_SKIP() << "the FFT kernel reads none of these convs' layouts on this CPU";
  }
  // Without agreement the ranks would differ: rank 0 runs FFT, rank 1 none.
  EXPECT_EQ(Count(**own, "fft") > 0, rank == 0);

  auto agreed = CreateNetworkOnEveryRank(ConvSpec(), Measured(cache), MPI_COMM_WORLD);
  ASSERT_TRUE(agreed.ok()) << agreed.status().ToString();
  std::ostringstream mine;
  for (const auto& k : (*agreed)->ChosenKernels()) mine << k.op << "." << k.pass << "=" << k.kernel << ";";
  const std::string rank0 = BroadcastString(mine.str(), MPI_COMM_WORLD);
  EXPECT_EQ(mine.str(), rank0);
  EXPECT_GT(Count(**agreed, "fft"), 0u);
}

}  // namespace
}  // namespace cosmoflow

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
