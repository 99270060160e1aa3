// Internal helpers of the network implementation (not a public contract): bf16 conversion, the
// counter-based hash behind dropout masks and parameter init, aligned scratch buffers, the
// weight-gradient kernels' per-thread partial sums.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace cosmoflow::nn_internal {

inline float Bf16ToF32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as oneDNN and the AVX512-BF16 instructions do; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

uint64_t SplitMix64(uint64_t x);
// Uniform in [0, 1) from (seed, step, layer, element): dropout masks without stored state.
float DropoutUniform(uint64_t seed, uint64_t step, int layer, int64_t index);

struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<void, AlignedFree>;
// Page-aligned, uninitialised; size rounded up to whole pages.
AlignedBuffer AllocateAligned(size_t bytes);

inline int64_t RoundUp16(int64_t x) { return (x + 15) / 16 * 16; }

// `floats` zeroed floats starting at a 64-byte boundary inside `storage` (resized to hold them).
inline float* AlignedFloats(std::vector<float>& storage, int64_t floats) {
  storage.assign(floats + 16, 0.f);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
}

// Adds threads 1.. of per-thread partials (each `stride` floats) into thread 0's, in thread order,
// so the sum is bit-reproducible for a fixed thread count (the weight-gradient kernels' reduction).
inline void SumPartialsInThreadOrder(float* partial, int64_t stride, int threads) {
  for (int t = 1; t < threads; ++t) {
    const float* other = partial + t * stride;
    for (int64_t i = 0; i < stride; ++i) partial[i] += other[i];
  }
}

}  // namespace cosmoflow::nn_internal
