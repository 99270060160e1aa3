#include "synth/importer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/io/dataset.h"
#include "synth/mlperf.h"
#include "synth/tfrecord.h"
#include "test_util.h"

namespace cosmoflow {
namespace synth {
namespace {

using testing::Gunzip;
using testing::ReadAll;
using testing::RealDataDir;
using testing::RealFiles;
using testing::TempDir;
using testing::WriteGzip;

MlperfSample DecodeFile(const std::string& path) {
  auto reader = TfRecordReader::Open(path);
  EXPECT_TRUE(reader.ok());
  std::string record;
  bool eof = false;
  EXPECT_TRUE((*reader)->Next(&record, &eof).ok());
  auto s = DecodeMlperfExample(record);
  EXPECT_TRUE(s.ok());
  return std::move(s).value();
}

TEST(ImporterTest, RealFilesBecomeAShardThatReadsBackExactly) {
  auto files = RealFiles();
  CF_REQUIRE_REAL_DATA(files);
  TempDir dir("import-real");
  ImportOptions o;
  o.out_dir = dir / "out";
  o.progress = false;
  o.report_path = dir / "report.tsv";
  o.command_line = "importer_test";
  ImportStats stats;
  Status s = ImportMlperf(files, o, &stats);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(stats.records, 3);
  EXPECT_EQ(stats.skipped_records, 0);
  ASSERT_EQ(stats.shards.size(), 1u);
  EXPECT_EQ(stats.shards[0], dir / "out/mlperf-00000000.h5");
  EXPECT_GT(stats.uncompressed_bytes, 3 * 16777216);

  auto reader = DatasetReader::Open(stats.shards[0]);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const DatasetInfo& info = (*reader)->info();
  EXPECT_EQ((*reader)->size(), 3);
  EXPECT_EQ(info.shape, (CubeShape{4, 128, 128, 128}));
  EXPECT_EQ(info.param_names, (std::vector<std::string>{"Omega_M", "sigma_8", "n_s", "H0"}));
  EXPECT_EQ(info.param_units[3], "km/s/Mpc");
  EXPECT_EQ(info.redshifts, (std::vector<double>{0, 0.5, 1.5, 3}));
  EXPECT_TRUE(info.has_unit_params);
  EXPECT_NE(info.provenance.find(files[1]), std::string::npos);
  EXPECT_NE(info.generator.find("mlperf-tfrecord"), std::string::npos);
  auto unit = (*reader)->ReadAllUnitParams();
  ASSERT_TRUE(unit.ok());
  // Each cube's own box side, 128 H0/70 Mpc/h (the README's H0 values: 68.04, 70.87, 69.73).
  auto box = (*reader)->ReadSampleField(kSampleBoxSize);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  ASSERT_EQ(box->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR((*box)[i], 128.0 * MlperfUnitToPhysical(3, (*unit)[i * 4 + 3]) / 70.0, 1e-4);
  }
  EXPECT_NEAR((*box)[0], 124.41, 0.01);
  for (int i = 0; i < 3; ++i) {
    const MlperfSample expected = DecodeFile(files[i]);
    auto cube = (*reader)->ReadCube(i);
    ASSERT_TRUE(cube.ok());
    EXPECT_EQ(std::memcmp(cube->raw(), expected.cube.raw(), expected.cube.size_bytes()), 0) << i;
    auto params = (*reader)->ReadParams(i);
    ASSERT_TRUE(params.ok());
    for (int p = 0; p < 4; ++p) {
      EXPECT_FLOAT_EQ((*unit)[i * 4 + p], expected.unit[p]);
      EXPECT_NEAR((*params)[p], MlperfUnitToPhysical(p, expected.unit[p]),
                  1e-5 * kMlperfParamCentre[p]);
    }
  }
  const std::string report = ReadAll(o.report_path);
  EXPECT_NE(report.find(files[2] + "\t0\timported\t" + stats.shards[0] + "\t2"), std::string::npos)
      << report;
}

TEST(ImporterTest, ShardsGroupFilesAndCorruptInputIsFatalOrSkipped) {
  auto files = RealFiles();
  CF_REQUIRE_REAL_DATA(files);
  TempDir dir("import-corrupt");
  std::string stream = Gunzip(files[1]);
  stream[stream.size() / 2] ^= 0x01;
  const std::string corrupt = dir / "corrupt.tfrecord";
  WriteGzip(corrupt, stream);
  const std::vector<std::string> inputs = {files[0], corrupt, files[2]};

  ImportOptions o;
  o.out_dir = dir / "fatal";
  o.progress = false;
  o.files_per_shard = 2;
  ImportStats stats;
  Status s = ImportMlperf(inputs, o, &stats);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(corrupt), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("data CRC mismatch"), std::string::npos) << s.message();
  // Nothing under a final shard name: the half-written shard was discarded.
  EXPECT_FALSE(std::filesystem::exists(dir / "fatal/mlperf-00000000.h5"));

  o.out_dir = dir / "skip";
  o.skip_corrupt = true;
  o.report_path = dir / "skip.tsv";
  o.prefix = "part";
  o.first_file_number = 100;
  s = ImportMlperf(inputs, o, &stats);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.skipped_records, 1);
  EXPECT_EQ(stats.files_with_errors, 1);
  ASSERT_EQ(stats.errors.size(), 1u);
  EXPECT_NE(stats.errors[0].find(corrupt), std::string::npos);
  ASSERT_EQ(stats.shards.size(), 2u);
  EXPECT_EQ(stats.shards[0], dir / "skip/part-00000100.h5");
  EXPECT_EQ(stats.shards[1], dir / "skip/part-00000102.h5");
  auto dataset = Dataset::Open(dir / "skip");
  ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
  EXPECT_EQ((*dataset)->size(), 2);
  auto second = (*dataset)->ReadCube(1);
  ASSERT_TRUE(second.ok());
  const MlperfSample expected = DecodeFile(files[2]);
  EXPECT_EQ(std::memcmp(second->raw(), expected.cube.raw(), expected.cube.size_bytes()), 0);
  const std::string report = ReadAll(o.report_path);
  EXPECT_NE(report.find(corrupt + "\t0\tskipped"), std::string::npos) << report;
}

TEST(ImporterTest, FileListsAndBadOptions) {
  TempDir dir("import-list");
  testing::WriteAll(dir / "list.txt", "# comment\n/a/b.tfrecord\n\n/c/d.tfrecord  \n");
  auto list = ReadFileList(dir / "list.txt");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<std::string>{"/a/b.tfrecord", "/c/d.tfrecord"}));
  EXPECT_EQ(ReadFileList(dir / "nope.txt").status().code(), StatusCode::kNotFound);

  ImportOptions o;
  ImportStats stats;
  EXPECT_FALSE(ImportMlperf({"x"}, o, &stats).ok());  // no output directory
  o.out_dir = dir / "out";
  o.progress = false;
  Status missing = ImportMlperf({dir / "missing.tfrecord"}, o, &stats);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("missing.tfrecord"), std::string::npos);
}

}  // namespace
}  // namespace synth
}  // namespace cosmoflow
