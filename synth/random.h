// Counter-based random numbers: every value is a pure function of (seed, sample index, stream,
// counter), so a cube is reproducible from (seed, index) alone, whatever the thread count or the
// order in which samples are generated.
//
// The mixer is SplitMix64's finaliser (Steele, Lea & Flood 2014, "Fast splittable pseudorandom
// number generators", OOPSLA; the constants of Vigna's splitmix64.c). A stream's key is the mixed
// (seed, index, stream) triple; value j of the stream is Mix64(key + (j + 1) * golden ratio), i.e.
// SplitMix64 started at the key, evaluated at position j without iterating.
#pragma once

#include <cmath>
#include <cstdint>

namespace cosmoflow {
namespace synth {

inline constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ull;

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Streams used by the generator; new uses must take new numbers so old cubes stay reproducible.
enum class RandomStream : uint64_t { kParameters = 1, kWhiteNoise = 2 };

inline uint64_t StreamKey(uint64_t seed, uint64_t index, RandomStream stream) {
  uint64_t k = Mix64(seed + kGolden64);
  k = Mix64(k ^ (index + kGolden64 * 3));
  return Mix64(k ^ (static_cast<uint64_t>(stream) * kGolden64));
}

inline uint64_t RandomBits(uint64_t key, uint64_t counter) {
  return Mix64(key + (counter + 1) * kGolden64);
}

// Uniform in (0, 1): 53 random bits, offset by half a step so that 0 never occurs.
inline double RandomUniform(uint64_t key, uint64_t counter) {
  return (static_cast<double>(RandomBits(key, counter) >> 11) + 0.5) * 0x1.0p-53;
}

// Two independent standard normal deviates (the cosine and sine branches of Box-Muller) from
// counter value `counter`; same tail cut as below.
inline void RandomNormalPair(uint64_t key, uint64_t counter, double* z0, double* z1) {
  const uint64_t bits = RandomBits(key, counter);
  const double u1 = (static_cast<double>(bits >> 32) + 0.5) * 0x1.0p-32;
  const double u2 = (static_cast<double>(bits & 0xffffffffull) + 0.5) * 0x1.0p-32;
  const double r = std::sqrt(-2.0 * std::log(u1));
  *z0 = r * std::cos(2.0 * M_PI * u2);
  *z1 = r * std::sin(2.0 * M_PI * u2);
}

// Standard normal deviate by the Box-Muller transform of two uniforms drawn from 64 bits
// (32 bits each, offset by half a step; the tails are cut at |x| ~ 6.7, probability ~ 2e-11).
inline double RandomNormal(uint64_t key, uint64_t counter) {
  const uint64_t bits = RandomBits(key, counter);
  const double u1 = (static_cast<double>(bits >> 32) + 0.5) * 0x1.0p-32;
  const double u2 = (static_cast<double>(bits & 0xffffffffull) + 0.5) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace synth
}  // namespace cosmoflow
