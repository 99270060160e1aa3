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

}  // namespace cosmoflow
