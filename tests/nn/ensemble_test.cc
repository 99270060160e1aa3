// Ensemble manifests: members load as one model only when they are all there, intact, unchanged
// since the manifest was written, and agree in spec and label normalisation; every refusal names
// the member or the field.
#include "core/nn/ensemble.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/nn/network.h"
#include "tests/common/files.h"

namespace cosmoflow {
namespace {

using testing::TempDir;

ModelSpec HeadSpec() {
  ModelSpec s = *BuiltinSpec("tiny32");
  s.uncertainty = UncertaintyHead::kGaussianFull;
  s.layers.back().units = 9;
  return s;
}

Checkpoint Member(const ModelSpec& spec, uint64_t seed) {
  NetworkOptions o;
  auto net = Network::Create(spec, o);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  (*net)->InitParameters(seed);
  Checkpoint c;
  c.spec = spec;
  c.weights = (*net)->ExportParameters();
  c.state.step = 10;
  c.state.rng_seed = seed;
  return c;
}

class EnsembleTest : public ::testing::Test {
 protected:
  // Also a reset: three intact members and their manifest.
  void SetUp() override {
    manifest_ = {};
    std::filesystem::create_directories(dir_ / "members");
    for (int k = 0; k < 3; ++k) Add(Member(HeadSpec(), 100 + k));
    Save();
  }
  // Writes member k's checkpoint and lists it in the manifest.
  void Add(const Checkpoint& c) {
    const std::string rel = "members/m" + std::to_string(manifest_.members.size()) + ".h5";
    auto sum = WriteCheckpoint(dir_ / rel, c);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    manifest_.members.push_back({rel, *sum});
  }
  void Save() { ASSERT_TRUE(WriteEnsembleManifest(manifest_path(), manifest_).ok()); }
  std::string manifest_path() { return dir_ / "ensemble.json"; }
  std::string LoadError() {
    auto e = LoadEnsemble(manifest_path());
    EXPECT_FALSE(e.ok());
    return e.ok() ? "" : e.status().message();
  }

  TempDir dir_;
  EnsembleManifest manifest_;
};

TEST_F(EnsembleTest, LoadsEveryMemberAndTheCalibration) {
  Calibration c;
  c.sigma_scale = {1.1, 0.9, 2.0};
  c.samples = 64;
  manifest_.calibration_json = CalibrationToJson(c, HeadSpec());
  Save();
  EXPECT_EQ(FindEnsembleManifest(dir_.path()), manifest_path());
  EXPECT_EQ(FindEnsembleManifest(manifest_path()), manifest_path());
  EXPECT_EQ(FindEnsembleManifest(dir_ / "members"), "");
  EXPECT_EQ(FindEnsembleManifest(dir_ / "members/m0.h5"), "");
  auto e = LoadEnsemble(manifest_path());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->members.size(), 3u);
  EXPECT_EQ(e->paths[2], dir_ / "members/m2.h5");
  EXPECT_EQ(e->calibration.sigma_scale, c.sigma_scale);
  EXPECT_EQ(e->checksum.size(), 8u);
  // The ensemble's checksum changes with any member or the calibration.
  const std::string before = e->checksum;
  c.sigma_scale[0] = 1.2;
  manifest_.calibration_json = CalibrationToJson(c, HeadSpec());
  Save();
  EXPECT_NE(LoadEnsemble(manifest_path())->checksum, before);
}

// The manifest's version is the oldest that holds its calibration: 2 for a power calibration, 3
// with an edge term, so an older reader refuses what it would apply only in part.
TEST_F(EnsembleTest, ManifestVersionFollowsTheCalibrationForm) {
  auto version = [&] {
    std::ifstream in(manifest_path());
    return nlohmann::json::parse(in)["format_version"].get<int>();
  };
  Calibration c;
  c.sigma_scale = {1.1, 0.9, 2.0};
  manifest_.calibration_json = CalibrationToJson(c, HeadSpec());
  Save();
  EXPECT_EQ(version(), 1);
  c.sigma_exponent = {0.5, 1.0, 0.0};
  c.sigma_reference = {0.1, 0.2, 0.3};
  manifest_.calibration_json = CalibrationToJson(c, HeadSpec());
  Save();
  EXPECT_EQ(version(), 2);
  c.sigma_edge = {0.3, 0.0, 0.0};
  c.prior_low = {0.25, 0.78, 0.9};
  c.prior_high = {0.35, 0.95, 1.0};
  manifest_.calibration_json = CalibrationToJson(c, HeadSpec());
  Save();
  EXPECT_EQ(version(), 3);
  auto e = LoadEnsemble(manifest_path());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->calibration.sigma_edge, c.sigma_edge);
}

TEST_F(EnsembleTest, MissingCorruptOrReplacedMembersAreRefusedNamingThem) {
  std::filesystem::remove(dir_ / "members/m1.h5");
  std::string why = LoadError();
  EXPECT_NE(why.find("member 1 (members/m1.h5)"), std::string::npos) << why;

  // Corrupt: a flipped byte in the middle of member 2.
  SetUp();
  std::string bytes = testing::ReadAll(dir_ / "members/m2.h5");
  bytes[bytes.size() / 2] ^= 0x20;
  testing::WriteAll(dir_ / "members/m2.h5", bytes);
  why = LoadError();
  EXPECT_NE(why.find("member 2 (members/m2.h5)"), std::string::npos) << why;

  // Replaced by another valid checkpoint after the manifest was written.
  SetUp();
  ASSERT_TRUE(WriteCheckpoint(dir_ / "members/m0.h5", Member(HeadSpec(), 999)).ok());
  why = LoadError();
  EXPECT_NE(why.find("member 0 (members/m0.h5)"), std::string::npos) << why;
  EXPECT_NE(why.find("changed after the manifest"), std::string::npos) << why;
}

TEST_F(EnsembleTest, MembersThatDisagreeAreRefusedNamingThem) {
  ModelSpec other = HeadSpec();
  other.outputs[1].scale = 0.1f;  // another label normalisation for sigma_8
  Add(Member(other, 7));
  Save();
  std::string why = LoadError();
  EXPECT_NE(why.find("member 3 (members/m3.h5)"), std::string::npos) << why;
  EXPECT_NE(why.find("label normalisation"), std::string::npos) << why;
  EXPECT_NE(why.find("sigma_8"), std::string::npos) << why;

  manifest_.members.pop_back();
  ModelSpec diagonal = HeadSpec();
  diagonal.uncertainty = UncertaintyHead::kGaussian;
  diagonal.layers.back().units = 6;
  Add(Member(diagonal, 8));
  Save();
  why = LoadError();
  EXPECT_NE(why.find("member 3"), std::string::npos) << why;
  EXPECT_NE(why.find("differs from member 0's spec"), std::string::npos) << why;
}

TEST_F(EnsembleTest, BadManifestsAreRefusedNamingTheField) {
  manifest_.calibration_json = R"({"sigma_scale": {"Omega_M": 1, "sigma_8": 0, "n_s": 1}})";
  Save();
  std::string why = LoadError();
  EXPECT_NE(why.find("sigma_scale.sigma_8"), std::string::npos) << why;

  std::ofstream(manifest_path())
      << R"({"format": "cosmoflow-ensemble", "format_version": 1, "members": []})";
  why = LoadError();
  EXPECT_NE(why.find("'members'"), std::string::npos) << why;
  std::ofstream(manifest_path())
      << R"({"format": "cosmoflow-ensemble", "format_version": 9, "members": []})";
  why = LoadError();
  EXPECT_NE(why.find("format_version 9"), std::string::npos) << why;
  std::ofstream(manifest_path()) << R"({"format": "cosmoflow-ensemble", "format_version": 1,
                                      "members": [{"checkpoint": "members/m0.h5"}]})";
  why = LoadError();
  EXPECT_NE(why.find("members[0]"), std::string::npos) << why;
  std::ofstream(manifest_path()) << "{\"format\": ";
  why = LoadError();
  EXPECT_NE(why.find("not valid JSON"), std::string::npos) << why;
}

}  // namespace
}  // namespace cosmoflow
