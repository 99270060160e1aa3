#include "synth/tfrecord.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "synth/mlperf.h"
#include "test_util.h"

namespace cosmoflow {
namespace synth {
namespace {

using testing::Gunzip;
using testing::ReadAll;
using testing::RealDataDir;
using testing::RealFiles;
using testing::TempDir;
using testing::WriteAll;
using testing::WriteGzip;

// Reads every record of a file; returns the first error.
Status ReadAllRecords(const std::string& path, std::vector<std::string>* records) {
  CF_ASSIGN_OR_RETURN(auto reader, TfRecordReader::Open(path));
  while (true) {
    std::string r;
    bool eof = false;
    CF_RETURN_IF_ERROR(reader->Next(&r, &eof));
    if (eof) return Status::Ok();
    records->push_back(std::move(r));
  }
}

// Per-channel statistics from ../shared/data/mlperf-cosmoflow/README.md (files sorted by name).
struct Expected {
  double mean[4];
  int max[4];
  double empty[4];
  float y[4];
};
const Expected kExpected[3] = {
    {{0.958, 0.969, 0.980, 0.987},
     {1019, 724, 371, 149},
     {0.681, 0.627, 0.517, 0.394},
     {-0.527f, -0.134f, 0.472f, -0.280f}},
    {{1.139, 1.116, 1.080, 1.053},
     {1016, 1028, 376, 156},
     {0.631, 0.569, 0.449, 0.328},
     {-0.360f, 0.327f, -0.866f, 0.124f}},
    {{0.915, 0.934, 0.958, 0.974},
     {932, 716, 432, 151},
     {0.690, 0.627, 0.508, 0.383},
     {0.521f, -0.013f, -0.009f, -0.039f}},
};

TEST(TfRecordTest, RealFilesDecodeToTheDocumentedStatistics) {
  auto files = RealFiles();
  CF_REQUIRE_REAL_DATA(files);
  for (int f = 0; f < 3; ++f) {
    std::vector<std::string> records;
    ASSERT_TRUE(ReadAllRecords(files[f], &records).ok()) << files[f];
    ASSERT_EQ(records.size(), 1u) << files[f];
    auto sample = DecodeMlperfExample(records[0]);
    ASSERT_TRUE(sample.ok()) << sample.status().ToString();
    ASSERT_EQ(sample->cube.shape(), (CubeShape{4, 128, 128, 128}));
    const int64_t n = sample->cube.shape().voxels();
    for (int c = 0; c < 4; ++c) {
      const int16_t* v = sample->cube.int16_data() + c * n;
      int64_t sum = 0, empty = 0;
      int mx = 0;
      for (int64_t i = 0; i < n; ++i) {
        sum += v[i];
        empty += v[i] == 0;
        mx = std::max<int>(mx, v[i]);
      }
      EXPECT_NEAR(double(sum) / n, kExpected[f].mean[c], 0.0006) << files[f] << " channel " << c;
      EXPECT_EQ(mx, kExpected[f].max[c]) << files[f] << " channel " << c;
      EXPECT_NEAR(double(empty) / n, kExpected[f].empty[c], 0.0006) << files[f] << " channel " << c;
    }
    for (int p = 0; p < 4; ++p) {
      EXPECT_NEAR(sample->unit[p], kExpected[f].y[p], 0.0006);
      EXPECT_NEAR(sample->physical[p], kMlperfParamCentre[p] * (1 + 0.1 * sample->unit[p]), 1e-4);
    }
    // Channel-first transpose: voxel (i, j, k) of channel c is element ((i*128+j)*128+k)*4+c of x.
    auto features = ParseExample(records[0]);
    ASSERT_TRUE(features.ok());
    const std::string_view x = features->at("x").bytes[0];
    for (int64_t idx : {int64_t{0}, int64_t{12345}, n / 2 + 77, n - 1}) {
      for (int c = 0; c < 4; ++c) {
        int16_t raw;
        std::memcpy(&raw, x.data() + (idx * 4 + c) * 2, 2);
        EXPECT_EQ(sample->cube.int16_data()[c * n + idx], raw);
      }
    }
  }
}

TEST(TfRecordTest, MappingRoundTrips) {
  for (int p = 0; p < kMlperfParams; ++p) {
    EXPECT_DOUBLE_EQ(MlperfUnitToPhysical(p, 0.0), kMlperfParamCentre[p]);
    EXPECT_NEAR(MlperfPhysicalToUnit(p, MlperfUnitToPhysical(p, -0.7)), -0.7, 1e-12);
  }
  EXPECT_NEAR(MlperfUnitToPhysical(0, 1.0), 0.33, 1e-12);   // Omega_M at u = 1
  EXPECT_NEAR(MlperfUnitToPhysical(3, -1.0), 63.0, 1e-12);  // H0 at u = -1
}

std::string SmallExample(int side, bool with_y = true, int y_count = 4) {
  std::string x(size_t(side) * side * side * 4 * 2, '\0');
  for (size_t i = 0; i < x.size() / 2; ++i) {
    const int16_t v = static_cast<int16_t>(i % 7);
    std::memcpy(&x[i * 2], &v, 2);
  }
  std::map<std::string, std::vector<float>> floats;
  if (with_y) floats["y"] = std::vector<float>(y_count, 0.5f);
  return EncodeExample({{"x", x}}, floats);
}

TEST(TfRecordTest, PlainAndGzipFilesWithSeveralRecordsRoundTrip) {
  TempDir dir("tfrecord-roundtrip");
  const std::string a = SmallExample(8), b = SmallExample(4);
  const std::string stream = FrameTfRecord(a) + FrameTfRecord(b) + FrameTfRecord("");
  WriteAll(dir / "plain.tfrecord", stream);
  WriteGzip(dir / "gz.tfrecord", stream);
  for (const char* name : {"plain.tfrecord", "gz.tfrecord"}) {
    std::vector<std::string> records;
    ASSERT_TRUE(ReadAllRecords(dir / name, &records).ok()) << name;
    ASSERT_EQ(records.size(), 3u);
    EXPECT_EQ(records[0], a);
    EXPECT_EQ(records[1], b);
    EXPECT_EQ(records[2], "");
  }
  auto s = DecodeMlperfExample(a, 8);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FLOAT_EQ(s->physical[1], 0.8f * 1.05f);
  // Channel-last element ((i*8+j)*8+k)*4+c had value (that index) % 7.
  const int64_t n = 512;
  EXPECT_EQ(s->cube.int16_data()[2 * n + 100], (100 * 4 + 2) % 7);
}

// Expects reading `path` to fail with DATA_LOSS and a message holding the file name and `what`.
void ExpectReadError(const std::string& path, const std::string& what) {
  std::vector<std::string> records;
  Status s = ReadAllRecords(path, &records);
  ASSERT_FALSE(s.ok()) << path;
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
}

TEST(TfRecordTest, CorruptCopiesOfARealFileAreReported) {
  auto files = RealFiles();
  CF_REQUIRE_REAL_DATA(files);
  TempDir dir("tfrecord-corrupt");
  const std::string stream = Gunzip(files[0]);
  ASSERT_GT(stream.size(), 16u * 1024 * 1024);

  std::string bad_data = stream;
  bad_data[stream.size() / 2] ^= 0x40;
  WriteGzip(dir / "bad_data.tfrecord", bad_data);
  ExpectReadError(dir / "bad_data.tfrecord", "data CRC mismatch");

  std::string bad_length = stream;
  bad_length[2] ^= 0x01;
  WriteGzip(dir / "bad_length.tfrecord", bad_length);
  ExpectReadError(dir / "bad_length.tfrecord", "length CRC mismatch");

  WriteGzip(dir / "truncated_record.tfrecord", stream.substr(0, stream.size() / 3));
  ExpectReadError(dir / "truncated_record.tfrecord", "truncated data");

  WriteAll(dir / "short_header.tfrecord", stream.substr(0, 7));
  ExpectReadError(dir / "short_header.tfrecord", "truncated header");

  WriteGzip(dir / "no_footer.tfrecord", stream.substr(0, stream.size() - 2));
  ExpectReadError(dir / "no_footer.tfrecord", "truncated data CRC");

  // The compressed file cut in half: zlib reports the early end of the gzip stream.
  const std::string compressed = ReadAll(files[0]);
  WriteAll(dir / "truncated_gzip.tfrecord", compressed.substr(0, compressed.size() / 2));
  ExpectReadError(dir / "truncated_gzip.tfrecord", "record 0");

  // A flipped bit in the compressed stream: inflate fails or the CRCs do.
  std::string flipped = compressed;
  flipped[compressed.size() / 2] ^= 0x10;
  WriteAll(dir / "flipped_gzip.tfrecord", flipped);
  ExpectReadError(dir / "flipped_gzip.tfrecord", "record 0");

  EXPECT_EQ(TfRecordReader::Open(dir / "missing.tfrecord").status().code(), StatusCode::kNotFound);
}

TEST(TfRecordTest, BadExamplesAreErrorsNotCrashes) {
  auto missing_y = DecodeMlperfExample(SmallExample(8, false), 8);
  ASSERT_FALSE(missing_y.ok());
  EXPECT_NE(missing_y.status().message().find("feature 'y'"), std::string::npos);

  auto wrong_size = DecodeMlperfExample(SmallExample(8), 128);
  ASSERT_FALSE(wrong_size.ok());
  EXPECT_NE(wrong_size.status().message().find("expected 16777216"), std::string::npos)
      << wrong_size.status().message();

  auto three_labels = DecodeMlperfExample(SmallExample(8, true, 3), 8);
  ASSERT_FALSE(three_labels.ok());
  EXPECT_NE(three_labels.status().message().find("4 unitPar"), std::string::npos);

  auto x_as_floats = DecodeMlperfExample(EncodeExample({}, {{"x", {1.f}}, {"y", {0, 0, 0, 0}}}), 8);
  ASSERT_FALSE(x_as_floats.ok());
  EXPECT_NE(x_as_floats.status().message().find("float_list"), std::string::npos);

  // Hostile wire data: a length that runs past the end, a truncated varint, wire type 7, and
  // every prefix of a valid example.
  const std::string valid = SmallExample(4);
  EXPECT_EQ(ParseExample(std::string("\x0a\xff\xff\xff\x0f", 5)).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(ParseExample(std::string("\x0a\x80", 2)).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseExample(std::string("\x0f\x00", 2)).status().code(), StatusCode::kDataLoss);
  int failures = 0;
  for (size_t cut = 1; cut < 64; ++cut)
    failures += !DecodeMlperfExample(valid.substr(0, cut), 4).ok();
  EXPECT_EQ(failures, 63);
  uint32_t state = 1;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string junk(64, '\0');
    for (char& c : junk) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
    auto r = ParseExample(junk);  // must return, either way
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    }
  }
}

// Found by fuzz_tfrecord (UBSan: memcpy from a null vector): a float feature whose packed list is
// empty is an empty list, not an error.
TEST(TfRecordTest, EmptyPackedFloatListIsAnEmptyList) {
  const std::string float_list = EncodeLengthDelimited(1, "");  // FloatList { packed value: [] }
  const std::string feature = EncodeLengthDelimited(2, float_list);
  const std::string entry = EncodeLengthDelimited(1, "y") + EncodeLengthDelimited(2, feature);
  const std::string example = EncodeLengthDelimited(1, EncodeLengthDelimited(1, entry));
  auto features = ParseExample(example);
  ASSERT_TRUE(features.ok()) << features.status().ToString();
  ASSERT_EQ(features->count("y"), 1u);
  EXPECT_EQ(features->at("y").kind, ExampleFeature::Kind::kFloat);
  EXPECT_TRUE(features->at("y").floats.empty());
}

}  // namespace
}  // namespace synth

}  // namespace cosmoflow
