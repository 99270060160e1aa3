#include "trainer/symmetry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace cosmoflow {
namespace {

std::vector<int16_t> Ramp(int channels, int side) {
  std::vector<int16_t> v(static_cast<size_t>(channels) * side * side * side);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int16_t>(i);  // all distinct
  return v;
}

TEST(CubeSymmetryTest, IdentityAndFortyEightDistinctBijections) {
  const int side = 4, channels = 2;
  auto src = Ramp(channels, side);
  std::set<std::vector<int16_t>> seen;
  for (int s = 0; s < kNumCubeSymmetries; ++s) {
    std::vector<int16_t> dst(src.size(), -1);
    ApplyCubeSymmetry(s, src.data(), dst.data(), channels, side);
    if (s == 0) {
      EXPECT_EQ(dst, src);
    }
    // A bijection of voxels within each channel: same multiset of values per channel.
    for (int c = 0; c < channels; ++c) {
      std::vector<int16_t> a(src.begin() + c * 64, src.begin() + (c + 1) * 64);
      std::vector<int16_t> b(dst.begin() + c * 64, dst.begin() + (c + 1) * 64);
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << "symmetry " << s << " channel " << c;
    }
    seen.insert(dst);
  }
  EXPECT_EQ(seen.size(), 48u);
}

TEST(CubeSymmetryTest, MatchesANaiveRotationAndReflection) {
  const int n = 3;
  auto src = Ramp(1, n);
  auto at = [&](int z, int y, int x) { return src[(z * n + y) * n + x]; };
  std::vector<int16_t> dst(src.size());
  // Symmetry 8*1 + 0: permutation {0,2,1} = swap y and x (a transpose), no flips.
  ApplyCubeSymmetry(8, src.data(), dst.data(), 1, n);
  for (int z = 0; z < n; ++z)
    for (int y = 0; y < n; ++y)
      for (int x = 0; x < n; ++x) EXPECT_EQ(dst[(z * n + y) * n + x], at(z, x, y));
  // Symmetry 1: identity permutation, flip the first (z) axis.
  ApplyCubeSymmetry(1, src.data(), dst.data(), 1, n);
  for (int z = 0; z < n; ++z)
    for (int y = 0; y < n; ++y)
      for (int x = 0; x < n; ++x) EXPECT_EQ(dst[(z * n + y) * n + x], at(n - 1 - z, y, x));
  // Float version agrees with int16.
  std::vector<float> fs(src.begin(), src.end()), fd(src.size());
  ApplyCubeSymmetry(37, fs.data(), fd.data(), 1, n);
  ApplyCubeSymmetry(37, src.data(), dst.data(), 1, n);
  for (size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(fd[i], dst[i]);
}

TEST(PeriodicShiftTest, MatchesModularIndexingAndComposes) {
  const int n = 5, channels = 2;
  auto src = Ramp(channels, n);
  auto at = [&](int c, int z, int y, int x) { return src[((c * n + z) * n + y) * n + x]; };
  const int shift[3] = {1, 4, 2};
  std::vector<int16_t> dst(src.size(), -1);
  ApplyPeriodicShift(shift, src.data(), dst.data(), channels, n);
  for (int c = 0; c < channels; ++c)
    for (int z = 0; z < n; ++z)
      for (int y = 0; y < n; ++y)
        for (int x = 0; x < n; ++x)
          ASSERT_EQ(dst[((c * n + z) * n + y) * n + x],
                    at(c, (z + 1) % n, (y + 4) % n, (x + 2) % n));
  const int zero[3] = {0, 0, 0};
  std::vector<int16_t> same(src.size(), -1);
  ApplyPeriodicShift(zero, src.data(), same.data(), channels, n);
  EXPECT_EQ(same, src);
  // Shifting by (1,4,2) then (3,3,4) is shifting by (4,2,1) (mod 5).
  const int more[3] = {3, 3, 4}, total[3] = {4, 2, 1};
  std::vector<int16_t> twice(src.size()), once(src.size());
  ApplyPeriodicShift(more, dst.data(), twice.data(), channels, n);
  ApplyPeriodicShift(total, src.data(), once.data(), channels, n);
  EXPECT_EQ(twice, once);
}

}  // namespace
}  // namespace cosmoflow
