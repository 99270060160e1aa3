// The `synth` program (synth/synth_main.cc), run as a user runs it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/io/dataset.h"
#include "synth/tfrecord.h"
#include "test_util.h"

namespace cosmoflow {
namespace synth {
namespace {

using testing::RunCommand;
using testing::TempDir;

const std::string kSynth = std::string(COSMOFLOW_BINARY_DIR) + "/synth/synth";

TEST(SynthCliTest, WritesShardsThatAreReproducibleAndSplittable) {
  TempDir dir("synth-cli");
  const std::string common = " --side 16 --voxel-size 2 --seed 9 --threads 2 --quiet";
  std::string err;
  ASSERT_EQ(
      RunCommand(kSynth + " --out " + dir / "a" + " --samples 5 --samples-per-shard 2" + common,
                 dir / "err", &err),
      0)
      << err;
  for (const char* name : {"synth-00000000.h5", "synth-00000002.h5", "synth-00000004.h5"}) {
    EXPECT_TRUE(std::filesystem::exists(dir / "a/" + name)) << name;
  }
  auto a = Dataset::Open(dir / "a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ((*a)->size(), 5);
  const DatasetInfo& info = (*a)->info();
  EXPECT_EQ(info.shape, (CubeShape{4, 16, 16, 16}));
  EXPECT_EQ(info.param_names, (std::vector<std::string>{"Omega_M", "sigma_8", "n_s"}));
  EXPECT_EQ(info.redshifts, (std::vector<double>{0, 0.5, 1.5, 3}));
  EXPECT_DOUBLE_EQ(info.box_size_mpc_h, 32.0);
  EXPECT_NE(info.provenance.find("seed=9"), std::string::npos);
  for (int i = 0; i < 5; ++i) {
    auto p = (*a)->ReadParams(i);
    ASSERT_TRUE(p.ok());
    EXPECT_GE((*p)[0], 0.25f);
    EXPECT_LE((*p)[0], 0.35f);
    EXPECT_GE((*p)[1], 0.78f);
    EXPECT_LE((*p)[1], 0.95f);
    EXPECT_GE((*p)[2], 0.90f);
    EXPECT_LE((*p)[2], 1.00f);
    auto cube = (*a)->ReadCube(i);
    int64_t sum = 0;
    for (int64_t v = 0; v < 4096; ++v) sum += cube->int16_data()[v];
    EXPECT_EQ(sum, 4096);  // z = 0 channel: one particle per voxel
  }
  // Samples 3..4 generated alone (another process, another thread count) are byte-identical.
  ASSERT_EQ(RunCommand(kSynth + " --out " + dir / "b.h5" +
                           " --samples 2 --first-index 3 --side 16 "
                           "--voxel-size 2 --seed 9 --threads 1 --quiet",
                       dir / "err", &err),
            0)
      << err;
  auto b = Dataset::Open(dir / "b.h5");
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)->size(), 2);
  for (int i = 0; i < 2; ++i) {
    auto x = (*a)->ReadCube(3 + i), y = (*b)->ReadCube(i);
    EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->size_bytes()), 0) << "sample " << 3 + i;
    EXPECT_EQ(*(*a)->ReadParams(3 + i), *(*b)->ReadParams(i));
  }
  // Fixed parameters and one redshift.
  ASSERT_EQ(
      RunCommand(
          kSynth + " --out " + dir / "c.h5" +
              " --samples 1 --side 16 --omega-m 0.3 "
              "--sigma-8 0.8 --n-s 0.96 --redshifts 0 --displacement 2lpt --assignment cic --quiet",
          dir / "err", &err),
      0)
      << err;
  auto c = Dataset::Open(dir / "c.h5");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->info().shape.channels, 1);
  EXPECT_EQ(*(*c)->ReadParams(0), (std::vector<float>{0.3f, 0.8f, 0.96f}));
  // H0 drawn too: a 4th label named and scaled as the MLPerf importer's.
  ASSERT_EQ(RunCommand(kSynth + " --out " + dir / "d.h5" +
                           " --samples 3 --side 16 --h0 63:77 --displacement za --quiet",
                       dir / "err", &err),
            0)
      << err;
  auto d = Dataset::Open(dir / "d.h5");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->info().param_names,
            (std::vector<std::string>{"Omega_M", "sigma_8", "n_s", "H0"}));
  EXPECT_EQ((*d)->info().param_units[3], "km/s/Mpc");
  for (int i = 0; i < 3; ++i) {
    auto p = (*d)->ReadParams(i);
    ASSERT_TRUE(p.ok());
    EXPECT_GE((*p)[3], 63.0f);
    EXPECT_LE((*p)[3], 77.0f);
  }
}

// The mlperf preset: the MLPerf prior (p0 (1 + 0.1 u), H0 included), the box scaled by H0/70
// per cube, four redshifts; explicit flags override it.
TEST(SynthCliTest, MlperfPresetHasThePriorAndGeometryAndYieldsToFlags) {
  TempDir dir("synth-cli-preset");
  std::string err;
  ASSERT_EQ(RunCommand(kSynth + " --preset mlperf --out " + dir / "p.h5" +
                           " --samples 40 --side 8 --pm-steps 2 --seed 4 --threads 2 --quiet",
                       dir / "err", &err),
            0)
      << err;
  auto r = DatasetReader::Open(dir / "p.h5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const DatasetInfo& info = (*r)->info();
  EXPECT_EQ(info.shape, (CubeShape{4, 8, 8, 8}));  // --side overrides 128
  EXPECT_EQ(info.param_names, (std::vector<std::string>{"Omega_M", "sigma_8", "n_s", "H0"}));
  EXPECT_EQ(info.redshifts, (std::vector<double>{0, 0.5, 1.5, 3}));
  EXPECT_DOUBLE_EQ(info.box_size_mpc_h, 8.0);  // 1 Mpc/h voxels at H0 = 70
  EXPECT_NE(info.provenance.find("preset: mlperf"), std::string::npos);
  EXPECT_NE(info.provenance.find("pm_steps=2"), std::string::npos);
  EXPECT_NE(info.provenance.find("pm_step_spacing=a"), std::string::npos);
  EXPECT_NE(info.provenance.find("pm_scheme=pm"), std::string::npos);
  auto params = (*r)->ReadAllParams();
  auto box = (*r)->ReadSampleField(kSampleBoxSize);
  ASSERT_TRUE(params.ok() && box.ok());
  const double centre[4] = {0.3, 0.8, 0.96, 70};
  double lo[4] = {1e9, 1e9, 1e9, 1e9}, hi[4] = {-1e9, -1e9, -1e9, -1e9};
  for (int i = 0; i < 40; ++i) {
    for (int p = 0; p < 4; ++p) {
      const double u = ((*params)[i * 4 + p] / centre[p] - 1) / 0.1;
      EXPECT_GE(u, -1.0 - 1e-5);
      EXPECT_LE(u, 1.0 + 1e-5);
      lo[p] = std::min(lo[p], u);
      hi[p] = std::max(hi[p], u);
    }
    EXPECT_NEAR((*box)[i], 8.0 * (*params)[i * 4 + 3] / 70.0, 1e-4);
  }
  // 40 uniform draws span most of [-1, 1] (each end beyond +-0.7 with probability > 0.9999).
  for (int p = 0; p < 4; ++p) {
    EXPECT_LT(lo[p], -0.7) << p;
    EXPECT_GT(hi[p], 0.7) << p;
  }
  // A fixed parameter overrides the preset's range for that parameter only.
  ASSERT_EQ(RunCommand(kSynth + " --preset mlperf --out " + dir / "q.h5" +
                           " --samples 3 --side 8 --pm-steps 2 --omega-m 0.31 --quiet",
                       dir / "err", &err),
            0)
      << err;
  auto q = DatasetReader::Open(dir / "q.h5");
  ASSERT_TRUE(q.ok());
  auto qp = (*q)->ReadAllParams();
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ((*qp)[i * 4], 0.31f);
  EXPECT_EQ(RunCommand(kSynth + " --preset lsst --out " + dir / "x.h5", dir / "err", &err), 2);
  EXPECT_NE(err.find("--preset 'lsst'"), std::string::npos) << err;
}

TEST(SynthCliTest, CreatesMissingParentDirectoriesAndNamesAnUnusableOne) {
  TempDir dir("synth-cli-dirs");
  const std::string common =
      " --side 8 --voxel-size 2 --samples 1 --threads 1 --quiet --displacement za";
  std::string err;
  ASSERT_EQ(RunCommand(kSynth + " --out " + dir / "runs/one/train" + common, dir / "err", &err), 0)
      << err;
  EXPECT_TRUE(std::filesystem::exists(dir / "runs/one/train/synth-00000000.h5"));
  // A regular file where a parent directory should be: exit 1, one line naming the path.
  testing::WriteAll(dir / "blocker", "x");
  EXPECT_EQ(RunCommand(kSynth + " --out " + dir / "blocker/train" + common, dir / "err", &err), 1);
  EXPECT_NE(err.find("blocker/train: cannot create directory"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(SynthCliTest, BadFlagsGiveOneLineAndStatus2) {
  TempDir dir("synth-cli-bad");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--samples 2", "--out"},
      {"--out X --bogus 1", "unknown flag --bogus"},
      {"--out X --side abc", "--side"},
      {"--out X --side 2", "--side"},
      {"--out X --redshifts 0,-1", "redshift"},
      {"--out X --ranges 0.3:0.2,0.8:0.9,0.9:1", "MIN > MAX"},
      {"--out X --transfer cdm", "transfer"},
      {"--out X --displacement nbody", "displacement"},
      {"--out X --pm-step-spacing log",
       "--pm-step-spacing: pm step spacing 'log' is not one of a, loga"},
      {"--out X --pm-scheme fastpm", "--pm-scheme: pm scheme 'fastpm' is not one of pm, cola"},
      {"--out X --samples", "needs a value"},
      {"--out X --omega-b 0.5", "Omega_b"},
      {"--out X --h0 80:60", "H0 range"},
  };
  for (const auto& [args, needle] : cases) {
    std::string err;
    EXPECT_EQ(RunCommand(kSynth + " " + args, dir / "err", &err), 2) << args;
    EXPECT_NE(err.find(needle), std::string::npos) << args << " -> " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << args << " -> " << err;
  }
}

}  // namespace
}  // namespace synth
}  // namespace cosmoflow
