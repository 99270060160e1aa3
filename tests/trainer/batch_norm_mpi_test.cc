// Runs under `mpirun -np 2`: a network with batch_norm on 2 ranks x batch b, its statistics summed
// by the trainer's BatchStatisticsAllreduce, computes what one process computes on batch 2b:
// the same outputs for each rank's samples, the same running statistics, and gradients whose
// average over the ranks (what the trainer's allreducer applies) equals the single process's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <random>

#include "core/nn/network.h"
#include "trainer/mpi_util.h"

namespace cosmoflow {
namespace {

LayerSpec Layer(LayerType t) {
  LayerSpec l;
  l.type = t;
  return l;
}

ModelSpec BatchNormSpec() {
  ModelSpec s;
  s.name = "bn-mpi";
  s.input_channels = 2;
  s.input_side = 6;
  s.input_transform = InputTransform::kNone;
  for (int i = 0; i < 3; ++i) s.outputs.push_back({"o" + std::to_string(i), "", 0.f, 1.f});
  LayerSpec conv = Layer(LayerType::kConv3d);
  conv.filters = 16;
  conv.kernel = 3;
  LayerSpec leaky = Layer(LayerType::kLeakyRelu);
  leaky.alpha = 0.1f;
  LayerSpec pool = Layer(LayerType::kAvgPool);
  pool.size = 2;
  LayerSpec dense = Layer(LayerType::kDense);
  dense.units = 8;
  LayerSpec out = Layer(LayerType::kDense);
  out.units = 3;
  s.layers = {conv, Layer(LayerType::kBatchNorm), leaky, pool, Layer(LayerType::kFlatten), dense,
              Layer(LayerType::kBatchNorm), out};
  return s;
}

std::unique_ptr<Network> Make(int batch, std::function<void(double*, int)> reduce) {
  NetworkOptions o;
  o.batch = batch;
  o.training = true;
  o.seed = 5;
  o.allreduce_sum = std::move(reduce);
  auto r = Network::Create(BatchNormSpec(), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(BatchNormMpiTest, TwoRanksOfBatchBEqualOneProcessOfBatch2B) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 2) << "run under mpirun -np 2";
  const int b = 3, outputs = 3;
  const int64_t in = 2 * 6 * 6 * 6;
  // The same global batch and upstream gradient on every rank (fixed seeds).
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> u(0.f, 2.f);
  std::vector<float> x(in * 2 * b), g(outputs * 2 * b);
  for (auto& v : x) v = u(rng);
  for (auto& v : g) v = u(rng) - 1.f;
  auto whole = Make(2 * b, nullptr);
  auto part = Make(b, BatchStatisticsAllreduce(MPI_COMM_WORLD));
  ASSERT_TRUE(whole && part);
  std::vector<float> y_whole(outputs * 2 * b), y_part(outputs * b);
  whole->Forward(x.data(), y_whole.data());
  part->Forward(x.data() + rank * b * in, y_part.data());
  for (int i = 0; i < outputs * b; ++i) {
    EXPECT_NEAR(y_part[i], y_whole[rank * b * outputs + i], 1e-5f * (1 + std::abs(y_whole[i]))) << i;
  }
  // Loss = mean over the batch: the single process scales by 1/2b, each rank by 1/b.
  std::vector<float> d_whole(g), d_part(g.begin() + rank * b * outputs, g.begin() + (rank + 1) * b * outputs);
  for (auto& v : d_whole) v /= 2 * b;
  for (auto& v : d_part) v /= b;
  whole->Backward(d_whole.data());
  part->Backward(d_part.data());
  for (size_t pi = 0; pi < whole->parameters().size(); ++pi) {
    const Parameter& pw = whole->parameters()[pi];
    const Parameter& pp = part->parameters()[pi];
    std::vector<double> avg(pp.grad, pp.grad + pp.numel());
    AllreduceSum(avg, MPI_COMM_WORLD);
    double scale = 1e-6;
    for (int64_t i = 0; i < pw.numel(); ++i) scale = std::max(scale, double(std::abs(pw.grad[i])));
    for (int64_t i = 0; i < pw.numel(); ++i) {
      // + 1e-6: a bias right before batch_norm has a zero gradient in exact arithmetic.
      ASSERT_NEAR(avg[i] / 2, pw.grad[i], 1e-4 * scale + 1e-6) << pw.name << "[" << i << "]";
    }
  }
  // Running statistics: identical to the single process's on every rank.
  auto tw = whole->ExportParameters(), tp = part->ExportParameters();
  ASSERT_EQ(tw.size(), tp.size());
  for (size_t i = 0; i < tw.size(); ++i) {
    if (tw[i].name.find("running") == std::string::npos) continue;
    for (int64_t k = 0; k < tw[i].numel(); ++k) EXPECT_NEAR(tp[i].data[k], tw[i].data[k], 1e-5) << tw[i].name;
  }
}

}  // namespace
}  // namespace cosmoflow

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
