// Bounded random-input fuzzing of the request validator: random and mutated messages must give OK
// (and then a cube that really fits the model) or INVALID_ARGUMENT with a message naming the field;
// never a crash, never a read outside the data (run under COSMOFLOW_SANITIZE to check the latter).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "server/validate.h"

namespace cosmoflow {
namespace {

constexpr ExpectedInput kExpected{1, 8};

void CheckResult(const v1::Cube& cube, const StatusOr<CubeView>& r) {
  if (r.ok()) {
    EXPECT_EQ(r->shape, (CubeShape{1, 8, 8, 8}));
    EXPECT_EQ(cube.data().size(), size_t(512) * DTypeSize(r->dtype));
    EXPECT_EQ(r->data, cube.data().data());
    // A valid cube converts without trouble and gives finite, non-negative inputs.
    std::vector<float> dst(512);
    CubeToNetworkInput(*r, InputTransform::kLog1p, dst.data());
    for (float v : dst) ASSERT_TRUE(std::isfinite(v) && v >= 0);
  } else {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("cube", 0), 0u) << r.status().message();
  }
}

v1::Cube ValidCube(std::mt19937_64& rng, bool as_float) {
  v1::Cube c;
  for (int e : {1, 8, 8, 8}) c.add_shape(e);
  c.set_dtype(as_float ? v1::DTYPE_FLOAT32 : v1::DTYPE_INT16);
  std::string data(512 * (as_float ? 4 : 2), '\0');
  for (int i = 0; i < 512; ++i) {
    if (as_float) {
      float v = float(rng() % 100) / 7.f;
      std::memcpy(&data[4 * i], &v, 4);
    } else {
      int16_t v = int16_t(rng() % 50);
      std::memcpy(&data[2 * i], &v, 2);
    }
  }
  c.set_data(data);
  return c;
}

TEST(ValidateFuzz, ValidCubesPass) {
  std::mt19937_64 rng(1);
  for (bool f : {false, true}) {
    v1::Cube c = ValidCube(rng, f);
    auto r = ValidateCube(c, kExpected);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    CheckResult(c, r);
  }
}

// The server's fast int16/log1p path gives exactly the engine's ApplyInputTransform, for every
// count value and both layouts (channel-last with one channel is the same memory).
TEST(CubeToNetworkInput, MatchesApplyInputTransformBitForBit) {
  std::vector<int16_t> counts(32768);
  for (int k = 0; k < 32768; ++k) counts[k] = int16_t(k);
  v1::Cube c;
  for (int e : {1, 32, 32, 32}) c.add_shape(e);
  c.set_dtype(v1::DTYPE_INT16);
  c.set_data(std::string(reinterpret_cast<const char*>(counts.data()), counts.size() * 2));
  auto view = ValidateCube(c, {1, 32});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  for (InputTransform t :
       {InputTransform::kLog1p, InputTransform::kNone, InputTransform::kDivideByMean,
        InputTransform::kOverdensity}) {
    std::vector<float> fast(counts.size()), reference(counts.size());
    CubeToNetworkInput(*view, t, fast.data());
    ApplyInputTransform(t, counts.data(), int64_t(counts.size()), int64_t(counts.size()),
                        reference.data());
    ASSERT_EQ(0, std::memcmp(fast.data(), reference.data(), fast.size() * 4)) << int(t);
  }
}

TEST(ValidateFuzz, RandomFieldValues) {
  std::mt19937_64 rng(42);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    v1::Cube c;
    const bool near_valid = rng() % 3 == 0;  // start from a fitting shape a third of the time
    const int rank = near_valid ? 3 + int(rng() % 2) : int(rng() % 7);
    for (int i = 0; i < rank; ++i) {
      if (near_valid) {
        c.add_shape(rank == 4 && (i == 0 || rng() % 8 == 0) ? 1 : 8);
        continue;
      }
      switch (rng() % 5) {
        case 0:
          c.add_shape(8);
          break;
        case 1:
          c.add_shape(1);
          break;
        case 2:
          c.add_shape(int64_t(rng()));
          break;  // huge or negative
        case 3:
          c.add_shape(-int64_t(rng() % 10));
          break;
        default:
          c.add_shape(int64_t(rng() % 20));
          break;
      }
    }
    c.set_dtype(v1::DType(rng() % 4 == 0 ? int(rng() % 10) - 3 : 1 + int(rng() % 2)));
    c.set_layout(v1::Layout(rng() % 5 == 0 ? int(rng() % 10) - 3 : int(rng() % 3)));
    size_t bytes = rng() % 3 == 0 ? rng() % 5000 : (rng() % 2 ? 1024 : 2048);
    std::string data(bytes, '\0');
    const int noise = near_valid ? 64 : 4;  // mostly zeros: valid values, occasionally not
    for (auto& ch : data) ch = char(rng() % noise == 0 ? rng() : 0);
    c.set_data(data);
    auto r = ValidateCube(c, kExpected);
    CheckResult(c, r);
    accepted += r.ok();
  }
  EXPECT_GT(accepted, 0) << "the generator never produced a valid cube: it explores too little";
}

TEST(ValidateFuzz, MutatedValidCubesAndRandomWireBytes) {
  std::mt19937_64 rng(7);
  int parsed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string wire = ValidCube(rng, rng() % 2).SerializeAsString();
    const int flips = 1 + int(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      switch (rng() % 4) {
        case 0:
          wire[rng() % wire.size()] ^= char(1u << (rng() % 8));
          break;
        case 1:
          wire.resize(rng() % wire.size());
          break;
        case 2:
          wire.insert(rng() % (wire.size() + 1), 1, char(rng()));
          break;
        default:
          wire[rng() % std::min<size_t>(wire.size(), 16)] = char(rng());
          break;  // the header
      }
      if (wire.empty()) wire = "x";
    }
    v1::Cube c;
    if (!c.ParseFromString(wire)) continue;
    ++parsed;
    CheckResult(c, ValidateCube(c, kExpected));
  }
  EXPECT_GT(parsed, 1000);
}

// The validator checks values a block (4096 voxels) at a time with a branch-free loop and searches
// a failing block voxel by voxel: whichever block a bad value lies in, at its edges or inside, the
// message names the first bad voxel, and values at the edge of the valid range pass.
TEST(ValidateCube, NamesTheFirstBadVoxelInAnyBlock) {
  constexpr int kSide = 32;  // 32768 voxels: 8 blocks
  const int64_t n = int64_t(kSide) * kSide * kSide;
  auto voxel = [](int64_t i) {  // "(c=0, d=.., h=.., w=..)" of flat index i, one channel
    return "(c=0, d=" + std::to_string(i / (kSide * kSide)) +
           ", h=" + std::to_string(i / kSide % kSide) + ", w=" + std::to_string(i % kSide) + ")";
  };
  auto make = [&](bool as_float, const std::vector<std::pair<int64_t, float>>& values) {
    v1::Cube c;
    for (int e : {1, kSide, kSide, kSide}) c.add_shape(e);
    c.set_dtype(as_float ? v1::DTYPE_FLOAT32 : v1::DTYPE_INT16);
    std::string data(size_t(n) * (as_float ? 4 : 2), '\0');
    for (auto [i, v] : values) {
      if (as_float) {
        std::memcpy(&data[4 * i], &v, 4);
      } else {
        int16_t k = int16_t(v);
        std::memcpy(&data[2 * i], &k, 2);
      }
    }
    c.set_data(data);
    return c;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{12345}, n - 1}) {
    const int64_t later = std::min(n - 1, at + 5000);  // a second bad value after the first
    struct Case {
      bool as_float;
      float value;
      const char* what;
    };
    for (const Case& k : {Case{false, -1.f, "negative count -1"},
                          Case{false, -32768.f, "negative count -32768"},
                          Case{true, std::nanf(""), "NaN"}, Case{true, inf, "infinite value"},
                          Case{true, -inf, "infinite value"},
                          Case{true, -0.5f, "negative value -0.5"},
                          Case{true, -std::numeric_limits<float>::denorm_min(),
                               "negative value -1.40129846e-45"}}) {
      std::vector<std::pair<int64_t, float>> values = {{at, k.value}};
      if (later != at) values.push_back({later, -2.f});
      auto r = ValidateCube(make(k.as_float, values), {1, kSide});
      ASSERT_FALSE(r.ok()) << k.what << " at " << at;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find(std::string(k.what) + " at voxel " + voxel(at)),
                std::string::npos)
          << r.status().message();
    }
  }
  // The edges of the valid range: -0.0 (compares >= 0), the smallest denormal, FLT_MAX, int16 max.
  EXPECT_TRUE(ValidateCube(make(true, {{0, -0.f},
                                       {4096, std::numeric_limits<float>::denorm_min()},
                                       {n - 1, std::numeric_limits<float>::max()}}),
                           {1, kSide})
                  .ok());
  EXPECT_TRUE(ValidateCube(make(false, {{4095, 32767.f}, {n - 1, 1.f}}), {1, kSide}).ok());
}

}  // namespace
}  // namespace cosmoflow
