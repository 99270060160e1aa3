#include "core/nn/checkpoint.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstring>

#include "tests/common/files.h"

namespace cosmoflow {
namespace {

using testing::TempDir;

constexpr float kMarker = 1234.5678f;  // a value we can find in the file to corrupt it

Checkpoint Make(int64_t step) {
  Checkpoint ck;
  ck.spec = *BuiltinSpec("tiny32");
  const int64_t n = ck.spec.NumParameters();
  NamedTensor w{"all.weights", {n}, std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) w.data[i] = 0.001f * float(i % 997) + float(step);
  w.data[n / 2] = kMarker;
  ck.weights.push_back(w);
  ck.optimizer_state.push_back({"adam.m.all.weights", {2, 3}, {1, 2, 3, 4, 5, 6}});
  ck.state = {step, step / 10, step * 8, 42u, "adam"};
  ck.provenance = {{"dataset", "/data/train"}, {"ranks", "2"}};
  return ck;
}

TEST(CheckpointTest, RoundTripKeepsEverything) {
  TempDir dir;
  Checkpoint ck = Make(7);
  auto sum = WriteCheckpoint(dir / "a.h5", ck);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(sum->size(), 8u);
  auto r = ReadCheckpoint(dir / "a.h5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->checksum, *sum);
  EXPECT_EQ(r->spec.ToJson(), ck.spec.ToJson());
  ASSERT_EQ(r->weights.size(), 1u);
  EXPECT_EQ(r->weights[0].name, "all.weights");
  EXPECT_EQ(r->weights[0].data, ck.weights[0].data);
  ASSERT_EQ(r->optimizer_state.size(), 1u);
  EXPECT_EQ(r->optimizer_state[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->optimizer_state[0].data, ck.optimizer_state[0].data);
  EXPECT_EQ(r->state.step, 7);
  EXPECT_EQ(r->state.samples_seen, 56);
  EXPECT_EQ(r->state.rng_seed, 42u);
  EXPECT_EQ(r->state.optimizer, "adam");
  EXPECT_EQ(r->provenance, ck.provenance);
}

// A command line or path that is not UTF-8 (a Latin-1 file name) is stored with U+FFFD in its
// place; it used to escape WriteCheckpoint as an uncaught nlohmann::json exception (found by
// fuzz/checkpoint_fuzz.cc).
TEST(CheckpointTest, ProvenanceThatIsNotUtf8IsStoredReplaced) {
  TempDir dir;
  Checkpoint ck = Make(3);
  ck.provenance["command"] = "cosmoflow-train --train /data/\xe9t\xe9";
  auto sum = WriteCheckpoint(dir / "a.h5", ck);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  auto r = ReadCheckpoint(dir / "a.h5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->provenance.at("command"), "cosmoflow-train --train /data/\xef\xbf\xbdt\xef\xbf\xbd");
  EXPECT_EQ(r->weights[0].data, ck.weights[0].data);
}

TEST(CheckpointTest, FlippedByteIsDetected) {
  TempDir dir;
  ASSERT_TRUE(WriteCheckpoint(dir / "a.h5", Make(1)).ok());
  std::string bytes = testing::ReadAll(dir / "a.h5");
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&kMarker), 4));
  ASSERT_NE(at, std::string::npos);
  bytes[at] ^= 0x01;
  testing::WriteAll(dir / "a.h5", bytes);
  auto r = ReadCheckpoint(dir / "a.h5");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos) << r.status().message();
}

TEST(CheckpointTest, RefusesOtherFilesAndWrongSizes) {
  TempDir dir;
  testing::WriteAll(dir / "text.h5", "hello");
  EXPECT_NE(ReadCheckpoint(dir / "text.h5").status().message().find("not an HDF5 file"), std::string::npos);
  EXPECT_EQ(ReadCheckpoint(dir / "none.h5").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(WriteCheckpoint(dir / "a.h5", Make(1)).ok());
  std::string bytes = testing::ReadAll(dir / "a.h5");
  testing::WriteAll(dir / "trunc.h5", bytes.substr(0, bytes.size() * 2 / 3));
  EXPECT_FALSE(ReadCheckpoint(dir / "trunc.h5").ok());

  Checkpoint wrong = Make(1);
  wrong.weights[0].data.pop_back();  // values no longer match the shape
  EXPECT_EQ(WriteCheckpoint(dir / "w.h5", wrong).status().code(), StatusCode::kInvalidArgument);
  Checkpoint other = Make(1);
  other.weights[0] = {"all.weights", {10}, std::vector<float>(10)};
  ASSERT_TRUE(WriteCheckpoint(dir / "o.h5", other).ok());
  auto r = ReadCheckpoint(dir / "o.h5");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("tiny32"), std::string::npos) << r.status().message();
}

TEST(CheckpointTest, DirectoryKeepsLastKAndFallsBackPastCorruptLatest) {
  TempDir dir;
  std::string ckdir = dir / "ckpts";
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(SaveCheckpointToDir(ckdir, Make(step), 3).ok());
  EXPECT_EQ(testing::ReadAll(ckdir + "/LATEST"), "ckpt-000000040.h5\n");
  EXPECT_TRUE(testing::ReadAll(ckdir + "/ckpt-000000010.h5").empty()) << "oldest should be deleted";
  auto latest = FindLatestCheckpoint(ckdir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, ckdir + "/ckpt-000000040.h5");

  // Corrupt the newest: the previous one is chosen.
  std::string path = ckdir + "/ckpt-000000040.h5";
  std::string bytes = testing::ReadAll(path);
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&kMarker), 4));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] ^= 0x40;
  testing::WriteAll(path, bytes);
  latest = FindLatestCheckpoint(ckdir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, ckdir + "/ckpt-000000030.h5");
  // No temporary files are left behind.
  EXPECT_EQ(std::system(("test -z \"$(ls " + ckdir + " | grep tmp)\"").c_str()), 0);

  TempDir empty;
  EXPECT_EQ(FindLatestCheckpoint(empty.path()).status().code(), StatusCode::kNotFound);
}

int64_t FormatVersion(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  int64_t v = -1;
  H5Aread(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Fclose(f);
  return v;
}

// A checkpoint of tiny32 with a full-covariance head and fitted calibration factors.
Checkpoint MakeCalibrated() {
  Checkpoint ck = Make(3);
  ck.spec.uncertainty = UncertaintyHead::kGaussianFull;
  ck.spec.layers.back().units = 9;
  const int64_t n = ck.spec.NumParameters();
  ck.weights[0] = {"all.weights", {n}, std::vector<float>(n, 0.5f)};
  ck.calibration.sigma_scale = {1.25, 0.5, 3.0};
  ck.calibration.prior_low = {0.25, 0.78, 0.9};
  ck.calibration.prior_high = {0.35, 0.95, 1.0};
  ck.calibration.samples = 512;
  return ck;
}

TEST(CheckpointTest, CalibrationRoundTripsIsCheckedAndSetsTheVersion) {
  TempDir dir;
  ASSERT_TRUE(WriteCheckpoint(dir / "plain.h5", Make(1)).ok());
  EXPECT_EQ(FormatVersion(dir / "plain.h5"), 1) << "a checkpoint without a head stays readable by older builds";
  ASSERT_TRUE(WriteCheckpoint(dir / "cal.h5", MakeCalibrated()).ok());
  EXPECT_EQ(FormatVersion(dir / "cal.h5"), 2);
  auto r = ReadCheckpoint(dir / "cal.h5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->spec.uncertainty, UncertaintyHead::kGaussianFull);
  EXPECT_EQ(r->calibration.sigma_scale, (std::vector<double>{1.25, 0.5, 3.0}));
  EXPECT_EQ(r->calibration.prior_low, (std::vector<double>{0.25, 0.78, 0.9}));
  EXPECT_EQ(r->calibration.samples, 512);

  // A power calibration is version 3, an edge term version 4 (older readers would drop either).
  Checkpoint power = MakeCalibrated();
  power.calibration.sigma_exponent = {0.5, 1.0, 0.0};
  power.calibration.sigma_reference = {0.1, 0.2, 0.3};
  ASSERT_TRUE(WriteCheckpoint(dir / "power.h5", power).ok());
  EXPECT_EQ(FormatVersion(dir / "power.h5"), 3);
  Checkpoint edge = power;
  edge.calibration.sigma_edge = {0.25, 0.1, 0.0};
  ASSERT_TRUE(WriteCheckpoint(dir / "edge.h5", edge).ok());
  EXPECT_EQ(FormatVersion(dir / "edge.h5"), 4);
  auto e = ReadCheckpoint(dir / "edge.h5");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->calibration.sigma_edge, edge.calibration.sigma_edge);
  EXPECT_EQ(e->calibration.sigma_exponent, power.calibration.sigma_exponent);

  // The factors are part of the checksum: one changed digit is a corrupt checkpoint.
  std::string bytes = testing::ReadAll(dir / "cal.h5");
  size_t at = bytes.find("\"sigma_8\":0.5");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 12] = '7';
  testing::WriteAll(dir / "tampered.h5", bytes);
  auto t = ReadCheckpoint(dir / "tampered.h5");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("checksum mismatch"), std::string::npos) << t.status().message();

  // A factor that is not positive and finite is never written, and the error names the field.
  Checkpoint bad = MakeCalibrated();
  bad.calibration.sigma_scale[2] = -2.0;
  auto w = WriteCheckpoint(dir / "bad.h5", bad);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("sigma_scale.n_s"), std::string::npos) << w.status().message();
}

}  // namespace
}  // namespace cosmoflow
