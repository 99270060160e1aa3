// The 48 symmetries of a cube (6 axis permutations x 8 reflections) and the periodic shifts of a
// periodic box, used as data augmentation.
//
// A cosmological density field is statistically isotropic, so a rotated or reflected cube has the
// same parameters; applying a random one of the 48 per sample multiplies the effective dataset
// size. Symmetry 0 is the identity. Works on channel-first cubes (C x S x S x S); each channel is
// transformed the same way. Thread-safe (pure functions).
#pragma once

#include <cstdint>

namespace cosmoflow {

inline constexpr int kNumCubeSymmetries = 48;

// dst[c][z][y][x] = src[c][p(z,y,x)] where p permutes and reflects the three spatial axes as
// selected by `symmetry` in [0, 48): symmetry / 8 picks the axis permutation, bits of symmetry % 8
// the reflections. src and dst must not overlap.
void ApplyCubeSymmetry(int symmetry, const int16_t* src, int16_t* dst, int channels, int side);
void ApplyCubeSymmetry(int symmetry, const float* src, float* dst, int channels, int side);

// dst[c][z][y][x] = src[c][(z + shift[0]) % side][(y + shift[1]) % side][(x + shift[2]) % side]:
// a translation with wrap-around. It preserves the statistics only of a whole periodic box (a
// simulated universe), whose opposite faces join; a sub-cube cut from one gains seams. Each shift
// in [0, side). src and dst must not overlap.
void ApplyPeriodicShift(const int shift[3], const int16_t* src, int16_t* dst, int channels,
                        int side);

}  // namespace cosmoflow
