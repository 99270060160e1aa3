#include "core/io/npy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/common/files.h"

namespace cosmoflow {
namespace {

using testing::TempDir;

Cube Ramp(CubeShape shape, DType dtype) {
  Cube c(shape, dtype);
  for (int64_t i = 0; i < shape.elements(); ++i) {
    if (dtype == DType::kInt16) c.int16_data()[i] = int16_t(i % 1000);
    else c.float_data()[i] = 0.5f * float(i);
  }
  return c;
}

// A minimal .npy writer independent of WriteNpy, to test the reader on headers numpy itself writes.
std::string NpyBytes(const std::string& descr, const std::string& fortran, const std::string& shape,
                     const std::string& payload, int version = 1) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  size_t pre = version == 1 ? 10 : 12;
  header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(char(version));
  out.push_back(0);
  uint32_t n = header.size();
  out.push_back(char(n & 0xff));
  out.push_back(char((n >> 8) & 0xff));
  if (version != 1) {
    out.push_back(char((n >> 16) & 0xff));
    out.push_back(char((n >> 24) & 0xff));
  }
  return out + header + payload;
}

TEST(NpyTest, RoundTripInt16AndFloat) {
  TempDir dir;
  for (DType dtype : {DType::kInt16, DType::kFloat32}) {
    Cube c = Ramp({2, 3, 4, 5}, dtype);
    ASSERT_TRUE(WriteNpy(dir / "c.npy", c).ok());
    auto r = ReadNpy(dir / "c.npy");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->shape(), c.shape());
    EXPECT_EQ(r->dtype(), dtype);
    EXPECT_EQ(0, std::memcmp(r->raw(), c.raw(), c.size_bytes()));
  }
}

TEST(NpyTest, ThreeDimensionalIsOneChannel) {
  TempDir dir;
  Cube c = Ramp({1, 4, 4, 4}, DType::kInt16);
  ASSERT_TRUE(WriteNpy(dir / "c.npy", c, /*squeeze_single_channel=*/true).ok());
  EXPECT_NE(testing::ReadAll(dir / "c.npy").find("(4, 4, 4)"), std::string::npos);
  auto r = ReadNpy(dir / "c.npy");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->shape(), (CubeShape{1, 4, 4, 4}));
}

TEST(NpyTest, ChannelLastIsTransposed) {
  TempDir dir;
  // (D,H,W,C) = (2,2,2,3): value = voxel*10 + channel.
  std::string payload;
  for (int v = 0; v < 8; ++v)
    for (int c = 0; c < 3; ++c) {
      int16_t x = int16_t(v * 10 + c);
      payload.append(reinterpret_cast<const char*>(&x), 2);
    }
  testing::WriteAll(dir / "cl.npy", NpyBytes("<i2", "False", "(2, 2, 2, 3)", payload, 2));
  auto r = ReadNpy(dir / "cl.npy", AxisLayout::kChannelLast);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->shape(), (CubeShape{3, 2, 2, 2}));
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 8; ++v) EXPECT_EQ(r->int16_data()[c * 8 + v], v * 10 + c);
}

TEST(NpyTest, BadInputsNameFileAndProblem) {
  TempDir dir;
  std::string payload(2 * 8, '\0');
  struct Case {
    std::string name, bytes, expect;
    StatusCode code;
  } cases[] = {
      {"fortran.npy", NpyBytes("<i2", "True", "(2, 2, 2)", payload), "Fortran", StatusCode::kInvalidArgument},
      {"f64.npy", NpyBytes("<f8", "False", "(2, 2, 2)", std::string(64, '\0')), "unsupported dtype",
       StatusCode::kInvalidArgument},
      {"bigend.npy", NpyBytes(">i2", "False", "(2, 2, 2)", payload), "unsupported dtype",
       StatusCode::kInvalidArgument},
      {"rank2.npy", NpyBytes("<i2", "False", "(4, 2)", payload), "rank 2", StatusCode::kInvalidArgument},
      {"trunc.npy", NpyBytes("<i2", "False", "(2, 2, 2)", payload.substr(0, 5)), "truncated", StatusCode::kDataLoss},
      {"magic.npy", "not numpy at all", "bad magic", StatusCode::kInvalidArgument},
      {"short.npy", "\x93NUM", "truncated", StatusCode::kDataLoss},
      // Found by fuzz/npy_fuzzer: a 100-byte file whose header claims 1 GiB made ReadNpy allocate it first.
      {"huge.npy", NpyBytes("<i2", "False", "(4, 1024, 1024, 128)", payload), "the file holds",
       StatusCode::kDataLoss},
      // Found by fuzz/npy_fuzzer: a 'shape' key with no tuple after it threw out of ReadNpy.
      {"noshape.npy", NpyBytes("<i2", "False", "", payload), "malformed shape",
       StatusCode::kInvalidArgument},
      {"notuple.npy", NpyBytes("<i2", "False", "8", payload), "malformed shape",
       StatusCode::kInvalidArgument},
  };
  for (const auto& c : cases) {
    testing::WriteAll(dir / c.name, c.bytes);
    auto r = ReadNpy(dir / c.name);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.name), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
  auto missing = ReadNpy(dir / "nope.npy");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(CubeTest, FiniteNonNegativeCheck) {
  Cube f({1, 2, 2, 2}, DType::kFloat32);
  EXPECT_TRUE(f.CheckFiniteNonNegative().ok());
  f.float_data()[3] = std::nanf("");
  EXPECT_NE(f.CheckFiniteNonNegative().message().find("NaN at element 3"), std::string::npos);
  f.float_data()[3] = INFINITY;
  EXPECT_NE(f.CheckFiniteNonNegative().message().find("infinite"), std::string::npos);
  Cube i({1, 2, 2, 2}, DType::kInt16);
  i.int16_data()[5] = -2;
  EXPECT_NE(i.CheckFiniteNonNegative().message().find("negative count -2 at element 5"), std::string::npos);
  EXPECT_FALSE((CubeShape{0, 2, 2, 2}).Validate().ok());
}

}  // namespace
}  // namespace cosmoflow
