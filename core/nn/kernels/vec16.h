// 16 floats as one value for the tiled kernels: one zmm with AVX-512, two ymm with AVX2 (GCC
// splits the vector type itself), so one source serves both builds.
#pragma once

// The helpers taking and returning V16 are inlined into their kernels, so GCC's note that an
// AVX2 build passes it differently from an AVX-512 one concerns no interface.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace cosmoflow {

typedef float V16 __attribute__((vector_size(64)));
typedef float V16u __attribute__((vector_size(64), aligned(4)));
inline V16 Load(const float* p) { return *reinterpret_cast<const V16u*>(p); }
inline void Store(float* p, V16 v) { *reinterpret_cast<V16u*>(p) = v; }

// 16 bf16 values (uint16 bit patterns) <-> 16 floats. Rounding to nearest even by integer
// arithmetic, which needs no AVX512-BF16 instruction (finite values only: activations and
// gradients are finite).
typedef unsigned int U16x32 __attribute__((vector_size(64)));
typedef unsigned short H16 __attribute__((vector_size(32)));
typedef unsigned short H16u __attribute__((vector_size(32), aligned(2)));
inline V16 LoadBf16(const unsigned short* p) {
  const U16x32 u = __builtin_convertvector(*reinterpret_cast<const H16u*>(p), U16x32) << 16;
  return __builtin_bit_cast(V16, u);
}
inline void StoreBf16(unsigned short* p, V16 v) {
  U16x32 u = __builtin_bit_cast(U16x32, v);
  u += 0x7fffu + ((u >> 16) & 1u);
  *reinterpret_cast<H16u*>(p) = __builtin_convertvector(u >> 16, H16);
}

}  // namespace cosmoflow
