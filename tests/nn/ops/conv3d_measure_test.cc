// Choice by measurement (NetworkOptions::kernel_selection = kMeasure): the network times every
// supported candidate of every conv pass, keeps the fastest (the rule's unless another is more
// than kMeasureMargin faster), caches the timings in a file that a second network reads instead of
// timing again, and a forced choice still wins. PinnedKernels reproduces a measured choice.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "core/nn/ops/onednn_util.h"
#include "tests/common/files.h"
#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

// The working weights a oneDNN kernel reads hold the master's values as soon as they exist: the
// measurement times oneDNN before the first step, and uninitialised heap bytes (denormals) once
// made a conv look 50x slower than it is.
TEST(KernelMeasureTest, WorkingWeightsHoldTheMasterFromInit) {
  using dnnl::memory;
  nn_internal::OpContext c;
  const memory::dims dims = {32, 4, 3, 3, 3};
  std::vector<float> master(32 * 4 * 27);
  for (size_t i = 0; i < master.size(); ++i) master[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  const memory::desc plain(dims, memory::data_type::f32, memory::format_tag::oidhw);
  const memory::desc blocked(dims, memory::data_type::f32, memory::format_tag::OIdhw16i16o);
  nn_internal::WorkingWeights w;
  w.Init(c, plain, master.data(), blocked, &blocked);
  ASSERT_FALSE(w.fwd_is_master);
  std::vector<float> back(master.size(), -1.f);
  memory back_mem(plain, c.eng, back.data());
  dnnl::reorder(w.fwd, back_mem).execute(c.strm, w.fwd, back_mem);
  c.strm.wait();
  EXPECT_EQ(back, master);
}

ModelSpec MeasureSpec() {
  return MakeSpec(2, 14, {ConvL(16, 4), LeakyL(0.1f), ConvL(16, 3, 1, true), LeakyL(0.1f), PoolL(false, 2),
                          ConvL(32, 2), LeakyL(0.1f), FlattenL(), DenseL(3)}, 3);
}

std::unique_ptr<Network> MeasuredNet(const ModelSpec& spec, const std::string& cache, KernelOptions kernels = {}) {
  NetworkOptions o;
  o.batch = 2;
  o.training = true;
  o.seed = 1;
  o.kernels = std::move(kernels);
  o.kernel_selection = KernelSelection::kMeasure;
  o.kernel_cache = cache;
  auto r = Network::Create(spec, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

struct Line {
  std::string problem, candidate;
  double seconds;
};

std::vector<Line> ReadCache(const std::string& path) {
  std::vector<Line> lines;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    std::istringstream row(text);
    Line l;
    std::getline(row, l.problem, '\t');
    std::getline(row, l.candidate, '\t');
    row >> l.seconds;
    lines.push_back(l);
  }
  return lines;
}

// Rewrites every timing: `fast` gets `fast_seconds`, every other candidate 1 s.
void Plant(const std::string& path, const std::string& fast, double fast_seconds) {
  std::vector<Line> lines = ReadCache(path);
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l.problem << '\t' << l.candidate << '\t' << (l.candidate == fast ? fast_seconds : 1.0) << '\n';
}

std::map<std::string, std::string> Choices(const Network& net) {
  std::map<std::string, std::string> m;
  for (const auto& k : net.ChosenKernels()) m[k.op + "." + k.pass] = k.kernel;
  return m;
}

// Whether every conv of MeasureSpec has a layout the FFT candidate reads on this CPU (the tests
// need two candidates per pass).
bool FftRunsHere() {
  auto net = MakeTrainingNet(MeasureSpec(), 2, {{"conv.fwd", "fft"}});
  return net && CountKernel(*net, "fwd", "fft") == 3;
}

TEST(Conv3dMeasureTest, TimesEveryPassAndCachesTheFigures) {
  if (!FftRunsHere()) GTEST_SKIP() << "no conv here has a layout the FFT kernel reads";
  TempDir dir("measure");
  const std::string cache = dir.path() + "/sub/timings.tsv";
  auto net = MeasuredNet(MeasureSpec(), cache);
  ASSERT_TRUE(net);
  std::vector<Line> lines = ReadCache(cache);
  ASSERT_FALSE(lines.empty()) << "no timings written to " << cache;
  std::map<std::string, int> passes;
  for (const auto& l : lines) {
    EXPECT_GT(l.seconds, 0) << l.problem;
    ++passes[l.problem.substr(0, l.problem.find(' '))];
  }
  // Three convs; the first has no backward-data. Every pass has at least fft and onednn.
  EXPECT_GE(passes["conv3d.fwd"], 2 * 3);
  EXPECT_GE(passes["conv3d.bwd_weights"], 2 * 3);
  EXPECT_GE(passes["conv3d.bwd_data"], 2 * 2);
  // A second network reads the figures instead of timing: planted timings decide its choice.
  Plant(cache, "fft", 1e-6);
  auto fft = MeasuredNet(MeasureSpec(), cache);
  ASSERT_TRUE(fft);
  EXPECT_EQ(CountKernel(*fft, "fwd", "fft"), 3u);
  EXPECT_EQ(CountKernel(*fft, "bwd_weights", "fft"), 3u);
  EXPECT_EQ(CountKernel(*fft, "bwd_data", "fft"), 2u);
  Plant(cache, "onednn", 1e-6);
  auto direct = MeasuredNet(MeasureSpec(), cache);
  ASSERT_TRUE(direct);
  EXPECT_EQ(CountKernel(*direct, "", "fft"), 0u);
  EXPECT_EQ(CountKernel(*direct, "fwd", "onednn"), 3u);
}

TEST(Conv3dMeasureTest, TheRuleStaysUnlessAnotherIsClearlyFaster) {
  if (!FftRunsHere()) GTEST_SKIP() << "no conv here has a layout the FFT kernel reads";
  TempDir dir("measure");
  const std::string cache = dir.path() + "/timings.tsv";
  ASSERT_TRUE(MeasuredNet(MeasureSpec(), cache));
  // fft 3% faster than every other candidate: within the margin, so the rule's choice stays.
  Plant(cache, "fft", 0.97);
  auto net = MeasuredNet(MeasureSpec(), cache);
  ASSERT_TRUE(net);
  EXPECT_EQ(CountKernel(*net, "", "fft"), 0u);
  EXPECT_EQ(Choices(*net), Choices(*MakeTrainingNet(MeasureSpec(), 2, {})));
}

TEST(Conv3dMeasureTest, ForcedChoiceWinsAndPinnedKernelsReproduceTheChoice) {
  if (!FftRunsHere()) GTEST_SKIP() << "no conv here has a layout the FFT kernel reads";
  TempDir dir("measure");
  const std::string cache = dir.path() + "/timings.tsv";
  ASSERT_TRUE(MeasuredNet(MeasureSpec(), cache));
  Plant(cache, "fft", 1e-6);
  auto forced = MeasuredNet(MeasureSpec(), cache, {{"conv.fwd", "onednn"}});
  ASSERT_TRUE(forced);
  EXPECT_EQ(CountKernel(*forced, "fwd", "fft"), 0u);
  EXPECT_EQ(CountKernel(*forced, "bwd_weights", "fft"), 3u);
  // Rank 0's choice as forced options: a rule network with them runs the same kernels.
  const KernelOptions pinned = PinnedKernels(forced->ChosenKernels());
  EXPECT_EQ(pinned.at("conv1.fwd"), "onednn");
  EXPECT_EQ(pinned.at("conv1.bwd_weights"), "fft");
  EXPECT_EQ(pinned.count("conv0.bwd_data"), 0u);  // the first conv computes no input gradient
  auto again = ParseKernelOptions(FormatKernelOptions(pinned));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, pinned);
  auto replica = MakeTrainingNet(MeasureSpec(), 2, pinned);
  ASSERT_TRUE(replica);
  EXPECT_EQ(Choices(*replica), Choices(*forced));
}

TEST(Conv3dMeasureTest, ABadCacheFileCostsATimingNotTheNetwork) {
  TempDir dir("measure");
  const std::string cache = dir.path() + "/timings.tsv";
  {
    std::ofstream out(cache);
    out << "garbage\nconv3d.fwd v1 nonsense\tfft\tnot-a-number\n\t\t\nconv3d.fwd x\tfft\t-1\n";
  }
  auto net = MeasuredNet(MeasureSpec(), cache);
  ASSERT_TRUE(net);
  for (const auto& l : ReadCache(cache)) EXPECT_GT(l.seconds, 0) << "kept an unreadable line: " << l.problem;
  // A cache path that cannot be written (a directory in its place): the network still builds.
  auto unwritable = MeasuredNet(MeasureSpec(), dir.path());
  EXPECT_TRUE(unwritable);
}

TEST(Conv3dMeasureTest, RuleSelectionNeitherTimesNorWritesTheCache) {
  TempDir dir("measure");
  NetworkOptions o;
  o.batch = 2;
  o.training = true;
  o.kernel_cache = dir.path() + "/timings.tsv";
  ASSERT_TRUE(Network::Create(MeasureSpec(), o).ok());
  EXPECT_FALSE(std::filesystem::exists(o.kernel_cache));
  EXPECT_EQ(ParseKernelSelection("measure").value(), KernelSelection::kMeasure);
  EXPECT_EQ(ParseKernelSelection("rule").value(), KernelSelection::kRule);
  EXPECT_FALSE(ParseKernelSelection("fastest").ok());
}

}  // namespace
}  // namespace cosmoflow
