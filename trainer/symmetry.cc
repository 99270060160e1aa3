#include "trainer/symmetry.h"

#include <algorithm>
#include <cassert>

namespace cosmoflow {
namespace {

constexpr int kAxisPermutations[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                         {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

template <typename T>
void Apply(int symmetry, const T* src, T* dst, int channels, int side) {
  assert(symmetry >= 0 && symmetry < kNumCubeSymmetries);
  const int* perm = kAxisPermutations[symmetry / 8];
  const int flips = symmetry % 8;
  const int64_t s = side;
  // Source strides of the three spatial axes (z, y, x) of a C-order cube.
  const int64_t axis_stride[3] = {s * s, s, 1};
  // Output axis k reads source axis perm[k], possibly reflected; precompute start and step so the
  // inner loop is one add per voxel.
  int64_t step[3], start = 0;
  for (int k = 0; k < 3; ++k) {
    const bool flip = (flips >> k) & 1;
    step[k] = flip ? -axis_stride[perm[k]] : axis_stride[perm[k]];
    if (flip) start += (s - 1) * axis_stride[perm[k]];
  }
  const int64_t voxels = s * s * s;
  for (int c = 0; c < channels; ++c) {
    const T* in = src + c * voxels;
    T* out = dst + c * voxels;
    for (int64_t z = 0; z < s; ++z) {
      for (int64_t y = 0; y < s; ++y) {
        int64_t offset = start + z * step[0] + y * step[1];
        T* row = out + (z * s + y) * s;
        for (int64_t x = 0; x < s; ++x, offset += step[2]) row[x] = in[offset];
      }
    }
  }
}

}  // namespace

void ApplyPeriodicShift(const int shift[3], const int16_t* src, int16_t* dst, int channels,
                        int side) {
  const int64_t s = side;
  for (int k = 0; k < 3; ++k) assert(shift[k] >= 0 && shift[k] < side);
  const int64_t voxels = s * s * s, tail = s - shift[2];
  for (int c = 0; c < channels; ++c) {
    for (int64_t z = 0; z < s; ++z) {
      const int64_t zs = (z + shift[0]) % s;
      for (int64_t y = 0; y < s; ++y) {
        const int16_t* in = src + c * voxels + (zs * s + (y + shift[1]) % s) * s;
        int16_t* row = dst + c * voxels + (z * s + y) * s;
        // A row shifted by shift[2] is two contiguous copies.
        std::copy(in + shift[2], in + s, row);
        std::copy(in, in + shift[2], row + tail);
      }
    }
  }
}

void ApplyCubeSymmetry(int symmetry, const int16_t* src, int16_t* dst, int channels, int side) {
  Apply(symmetry, src, dst, channels, side);
}
void ApplyCubeSymmetry(int symmetry, const float* src, float* dst, int channels, int side) {
  Apply(symmetry, src, dst, channels, side);
}

}  // namespace cosmoflow
