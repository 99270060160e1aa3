// Sub-cube cutting (synth/subcubes.h) and the cosmoflow-subcubes program.
#include "synth/subcubes.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/io/dataset.h"
#include "test_util.h"

namespace cosmoflow {
namespace synth {
namespace {

using testing::RunCommand;
using testing::TempDir;

// A voxel's value encodes where it is: parent p, channel c, position (d, h, w).
int16_t Value(int p, int c, int d, int h, int w) {
  return int16_t((p * 7 + c * 3 + d * 5 + h * 11 + w * 13) % 97);
}

// Writes `parents` cubes (2 channels, n^3) with per-cube boxes 10 * (p + 1) Mpc/h into two shards
// (so parent indices run across shards).
void WriteParents(const std::string& dir, int parents, int n) {
  DatasetInfo info;
  info.shape = CubeShape{2, n, n, n};
  info.param_names = {"Omega_M", "sigma_8", "n_s", "H0"};
  info.redshifts = {0.0, 3.0};
  info.box_size_mpc_h = 16;
  info.has_unit_params = true;
  info.sample_fields = {kSampleBoxSize};
  std::filesystem::create_directories(dir);
  const int first_shard = parents / 2;
  for (int shard = 0; shard < 2; ++shard) {
    auto w = DatasetWriter::Create(dir + "/p-" + std::to_string(shard) + ".h5", info);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (int p = shard ? first_shard : 0; p < (shard ? parents : first_shard); ++p) {
      Cube cube(info.shape, DType::kInt16);
      int16_t* v = cube.int16_data();
      for (int c = 0; c < 2; ++c)
        for (int d = 0; d < n; ++d)
          for (int h = 0; h < n; ++h)
            for (int x = 0; x < n; ++x) *v++ = Value(p, c, d, h, x);
      ASSERT_TRUE((*w)->Append(cube, {0.3f + 0.01f * p, 0.8f, 0.96f, 70.0f}, {0.1f * p, 0, 0, 0},
                               {10.0 * (p + 1)})
                      .ok());
    }
    ASSERT_TRUE((*w)->Close().ok());
  }
}

// The voxel (d, h, w) of parent p, channel c, coarsened by `bin`: the sum of its bin^3 block.
int Coarse(int p, int c, int d, int h, int w, int bin) {
  int sum = 0;
  for (int e = 0; e < bin * bin * bin; ++e)
    sum += Value(p, c, d * bin + e / (bin * bin), h * bin + e / bin % bin, w * bin + e % bin);
  return sum;
}

// Voxels of sub-cube q (side s, m per axis) of parent p that differ from the coarsened parent's
// slice; adds the sub-cube's counts to *mass.
int WrongVoxels(const Cube& cube, int p, int q, int m, int s, int bin, int64_t* mass) {
  const int16_t* v = cube.int16_data();
  const int ci = q / (m * m), cj = (q / m) % m, ck = q % m;
  int bad = 0;
  for (int c = 0; c < 2; ++c)
    for (int d = 0; d < s; ++d)
      for (int h = 0; h < s; ++h)
        for (int x = 0; x < s; ++x, ++v) {
          bad += *v != Coarse(p, c, ci * s + d, cj * s + h, ck * s + x, bin);
          *mass += *v;
        }
  return bad;
}

TEST(SubcubesTest, SubcubesAreTheParentsSlicesWithMassGroupsAndLabels) {
  TempDir dir("subcubes");
  const int parents = 3, n = 16, s = 8, m = 2;
  WriteParents(dir / "in", parents, n);
  SubcubeOptions o;
  o.in = dir / "in";
  o.out = dir / "out.h5";
  o.side = s;
  o.group_offset = 100;
  o.progress = false;
  SubcubeStats stats;
  ASSERT_TRUE(CutSubcubes(o, &stats).ok());
  EXPECT_EQ(stats.parents, parents);
  EXPECT_EQ(stats.subcubes, parents * m * m * m);
  auto r = DatasetReader::Open(o.out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->size(), parents * 8);
  EXPECT_EQ((*r)->info().shape, (CubeShape{2, s, s, s}));
  EXPECT_DOUBLE_EQ((*r)->info().box_size_mpc_h, 8.0);
  EXPECT_EQ((*r)->info().redshifts, (std::vector<double>{0.0, 3.0}));
  auto group = (*r)->ReadSampleField(kSampleGroup), sub = (*r)->ReadSampleField(kSampleSubcube),
       box = (*r)->ReadSampleField(kSampleBoxSize);
  auto unit = (*r)->ReadAllUnitParams();
  ASSERT_TRUE(group.ok() && sub.ok() && box.ok() && unit.ok());
  std::vector<int64_t> mass(parents, 0), parent_mass(parents, 0);
  for (int p = 0; p < parents; ++p)
    for (int c = 0; c < 2; ++c)
      for (int d = 0; d < n; ++d)
        for (int h = 0; h < n; ++h)
          for (int x = 0; x < n; ++x) parent_mass[p] += Value(p, c, d, h, x);
  for (int64_t i = 0; i < (*r)->size(); ++i) {
    const int p = static_cast<int>(i / 8), q = static_cast<int>(i % 8);
    EXPECT_EQ((*group)[i], 100 + p);
    EXPECT_EQ((*sub)[i], q);
    EXPECT_DOUBLE_EQ((*box)[i], 10.0 * (p + 1) * s / n);
    EXPECT_FLOAT_EQ((*r)->ReadParams(i)->at(0), 0.3f + 0.01f * p);
    EXPECT_FLOAT_EQ((*unit)[i * 4], 0.1f * p);
    auto cube = (*r)->ReadCube(i);
    ASSERT_TRUE(cube.ok());
    EXPECT_EQ(WrongVoxels(*cube, p, q, m, s, 1, &mass[p]), 0)
        << "sub-cube " << q << " of parent " << p;
  }
  EXPECT_EQ(mass, parent_mass);  // every voxel lands in exactly one sub-cube
}

// With --bin b every sub-cube voxel is the sum of the parent's b^3 block at the right place.
TEST(SubcubesTest, BinnedSubcubesSumTheParentsBlocks) {
  TempDir dir("subcubes-bin");
  const int parents = 2, n = 16, b = 2, s = 4, m = n / b / s;
  WriteParents(dir / "in", parents, n);
  SubcubeOptions o;
  o.in = dir / "in";
  o.out = dir / "out.h5";
  o.side = s;
  o.bin = b;
  o.progress = false;
  SubcubeStats stats;
  ASSERT_TRUE(CutSubcubes(o, &stats).ok());
  auto r = DatasetReader::Open(o.out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->size(), parents * m * m * m);
  EXPECT_DOUBLE_EQ((*r)->info().box_size_mpc_h, 16.0 * s * b / n);
  auto box = (*r)->ReadSampleField(kSampleBoxSize);
  ASSERT_TRUE(box.ok());
  int64_t mass = 0, parent_mass = 0;
  for (int p = 0; p < parents; ++p)
    for (int c = 0; c < 2; ++c)
      for (int d = 0; d < n; ++d)
        for (int h = 0; h < n; ++h)
          for (int x = 0; x < n; ++x) parent_mass += Value(p, c, d, h, x);
  for (int64_t i = 0; i < (*r)->size(); ++i) {
    const int p = static_cast<int>(i / (m * m * m)), q = static_cast<int>(i % (m * m * m));
    EXPECT_DOUBLE_EQ((*box)[i], 10.0 * (p + 1) * s * b / n);
    auto cube = (*r)->ReadCube(i);
    ASSERT_TRUE(cube.ok());
    EXPECT_EQ(WrongVoxels(*cube, p, q, m, s, b, &mass), 0)
        << "sub-cube " << q << " of parent " << p;
  }
  EXPECT_EQ(mass, parent_mass);
}

TEST(SubcubesTest, BinRefusesCountsBeyondInt16) {
  Cube cube(CubeShape{1, 4, 4, 4}, DType::kInt16);
  for (int64_t i = 0; i < 64; ++i) cube.int16_data()[i] = 4000;
  Cube out;
  ASSERT_TRUE(BinCube(cube, 2, &out).ok());  // 8 x 4000 fits
  EXPECT_EQ(out.shape(), (CubeShape{1, 2, 2, 2}));
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(out.int16_data()[i], 32000);
  cube.int16_data()[63] = 5000;  // the last block sums to 7 x 4000 + 5000 = 33000
  Status s = BinCube(cube, 2, &out);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("sums to 33000, beyond int16"), std::string::npos) << s.message();
}

TEST(SubcubesTest, ShardsPerParentsAndClearErrors) {
  TempDir dir("subcubes-cli");
  WriteParents(dir / "in", 5, 8);
  const std::string tool = std::string(COSMOFLOW_BINARY_DIR) + "/synth/cosmoflow-subcubes";
  std::string err;
  ASSERT_EQ(RunCommand(tool + " --in " + dir / "in" + " --out " +
                           dir / "out --side 4 --parents-per-shard 2 --quiet",
                       dir / "err", &err),
            0)
      << err;
  for (const char* name : {"subcubes-00000000.h5", "subcubes-00000002.h5", "subcubes-00000004.h5"})
    EXPECT_TRUE(std::filesystem::exists(dir / "out/" + name)) << name;
  auto all = Dataset::Open(dir / "out");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)->size(), 5 * 8);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --in " + dir / "in" + " --out " + dir / "x.h5 --side 3",
       "does not divide the cube side 8"},
      {" --in " + dir / "in" + " --out " + dir / "x.h5 --bin 3", "bin 3 does not divide"},
      {" --in " + dir / "in" + " --out " + dir / "x.h5 --bin 2 --side 8",
       "does not divide the cube side 4 (after bin 2)"},
      {" --in " + dir / "in" + " --out " + dir / "x.h5 --bin 0", "--bin must be in 1..1024"},
      {" --in " + dir / "nope --out " + dir / "x.h5", "nope"},
      {" --out " + dir / "x.h5", "--in and --out are required"},
  };
  for (const auto& [args, needle] : cases) {
    EXPECT_NE(RunCommand(tool + args, dir / "err", &err), 0) << args;
    EXPECT_NE(err.find(needle), std::string::npos) << args << " -> " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_FALSE(std::filesystem::exists(dir / "x.h5"));
  }
}

}  // namespace
}  // namespace synth
}  // namespace cosmoflow
