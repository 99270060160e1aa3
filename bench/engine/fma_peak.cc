#include "bench/engine/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace cosmoflow {
namespace {

// Accumulators per thread: more than FMA latency x pipes (4 x 2) so the loop is throughput-bound.
constexpr int kChains = 12;

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kWidth = 16;
inline Vec Splat(float x) { return _mm512_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kWidth = 8;
inline Vec Splat(float x) { return _mm256_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
#else
using Vec = float;
constexpr int kWidth = 1;
inline Vec Splat(float x) { return x; }
inline Vec Fma(Vec a, Vec b, Vec c) { return a * b + c; }
#endif

inline float Sum(Vec v) {
  float f[kWidth];
  std::memcpy(f, &v, sizeof(v));
  float s = 0;
  for (float x : f) s += x;
  return s;
}

// Runs `iters` rounds of kChains FMAs; returns a value the compiler cannot drop.
float FmaLoop(long iters, float seed) {
  Vec acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = Splat(seed + i);
  const Vec a = Splat(0.999999f), b = Splat(1e-7f);
  for (long it = 0; it < iters; ++it) {
    // Unrolled so that the accumulators live in registers, not in the array.
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = Fma(acc[i], a, b);
  }
  float s = 0;
  for (int i = 0; i < kChains; ++i) s += Sum(acc[i]);
  return s;
}

}  // namespace

double MeasureFmaPeakGflops(int threads) {
  constexpr long kIters = 20'000'000;
  double best = 0;
  volatile float sink = 0;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += FmaLoop(kIters, float(omp_get_thread_num()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    best = std::max(best, 2.0 * kChains * kWidth * double(kIters) * threads / s / 1e9);
  }
  return best;
}

}  // namespace cosmoflow
