#include "core/nn/kernels/first_block.h"

#include <stdexcept>

// The kernel is written against V16, a vector of 16 fp32 lanes (one per filter), implemented with
// AVX-512 (one zmm) or AVX2 + FMA (two ymm); it is built when the compiler targets either (the
// default build is -march=native). Elsewhere Supported() is false, the network runs the block as
// oneDNN's convolution + pooling, and the other members only report misuse.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define COSMOFLOW_FIRST_BLOCK_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define COSMOFLOW_FIRST_BLOCK_AVX2 1
#endif

#if defined(COSMOFLOW_FIRST_BLOCK_AVX512) || defined(COSMOFLOW_FIRST_BLOCK_AVX2)

#include <immintrin.h>
#include <omp.h>
// GCC 12's AVX-512 intrinsics start from a self-initialised "undefined" vector, which its
// -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593): not a defect here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

#include "core/nn/network_internal.h"

namespace cosmoflow {
namespace {

constexpr int kLanes = 16;  // filters per vector: up to 16

using Mask16 = uint16_t;  // bit i = lane i

#ifdef COSMOFLOW_FIRST_BLOCK_AVX512

constexpr const char* kIsa = "avx512";
// Register blocking for 32 zmm: 16 forward accumulators (two FMA ports of 4-cycle latency need 8
// independent chains at least; 8 ran the forward at 0.6 of the FMA peak); the weight gradient of a whole 3^3 kernel
// (27 accumulators) per pass over a conv row, one kd-slice per pass for 4^3 and 5^3.
constexpr int kChunk = 16;
constexpr int GradRowsPerPass(int k) { return k <= 3 ? k * k : k; }

struct V16 {
  __m512 v;
};
struct LaneMask {  // the first n lanes
  __mmask16 m;
};

inline V16 Zero() { return {_mm512_setzero_ps()}; }
inline V16 Set1(float x) { return {_mm512_set1_ps(x)}; }
inline V16 Load(const float* p) { return {_mm512_load_ps(p)}; }  // 64-byte aligned
inline void Store(float* p, V16 a) { _mm512_store_ps(p, a.v); }
inline V16 Add(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 Mul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 Fma(float x, V16 w, V16 acc) { return {_mm512_fmadd_ps(_mm512_set1_ps(x), w.v, acc.v)}; }
inline Mask16 Positive(V16 a) { return _mm512_cmp_ps_mask(a.v, _mm512_setzero_ps(), _CMP_GT_OQ); }
inline Mask16 Greater(V16 a, V16 b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ); }
inline Mask16 Equal(V16 a, V16 b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ); }
inline V16 Select(Mask16 m, V16 if_set, V16 if_clear) { return {_mm512_mask_blend_ps(m, if_clear.v, if_set.v)}; }
inline LaneMask FirstLanes(int n) { return {static_cast<__mmask16>((1u << n) - 1u)}; }
// 16 bytes <-> 16 lanes (values 0-255, exact in fp32).
inline V16 LoadBytes(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline void StoreBytes(uint8_t* p, V16 a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtusepi32_epi8(_mm512_cvttps_epu32(a.v)));
}
inline V16 LoadFirst(const float* p, LaneMask m) { return {_mm512_maskz_loadu_ps(m.m, p)}; }
inline void StoreFirst(float* p, V16 a, LaneMask m) { _mm512_mask_storeu_ps(p, m.m, a.v); }

inline V16 LoadBf16First(const uint16_t* p, LaneMask m) {
  __m256i h = _mm256_maskz_loadu_epi16(m.m, p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}

inline void StoreBf16First(uint16_t* p, V16 a, LaneMask m) {
#ifdef __AVX512BF16__
  __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a.v));
#else
  // Round to nearest even by integer arithmetic (finite values only: activations are finite).
  __m512i u = _mm512_castps_si512(a.v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
#endif
  _mm256_mask_storeu_epi16(p, m.m, h);
}

#else  // COSMOFLOW_FIRST_BLOCK_AVX2

constexpr const char* kIsa = "avx2";
// Register blocking for 16 ymm (a V16 takes two): 4 forward accumulators (8 ymm, + 2 for the
// weights + 1 broadcast); the weight gradient of one (kd, kh) kernel row per pass over a conv row
// (two for 2^3), so K accumulators.
constexpr int kChunk = 4;
constexpr int GradRowsPerPass(int k) { return k == 2 ? 2 : 1; }

struct V16 {
  __m256 lo, hi;
};
struct LaneMask {  // the first n lanes
  __m256i lo, hi;
  int n;
};

inline V16 Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 Set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 Load(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }  // 32-byte aligned
inline void Store(float* p, V16 a) {
  _mm256_store_ps(p, a.lo);
  _mm256_store_ps(p + 8, a.hi);
}
inline V16 Add(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 Mul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 Fma(float x, V16 w, V16 acc) {
  const __m256 b = _mm256_set1_ps(x);
  return {_mm256_fmadd_ps(b, w.lo, acc.lo), _mm256_fmadd_ps(b, w.hi, acc.hi)};
}
inline Mask16 Positive(V16 a) {
  const __m256 zero = _mm256_setzero_ps();
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, zero, _CMP_GT_OQ));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, zero, _CMP_GT_OQ));
  return static_cast<Mask16>(lo | (hi << 8));
}
inline Mask16 Greater(V16 a, V16 b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ));
  return static_cast<Mask16>(lo | (hi << 8));
}
inline Mask16 Equal(V16 a, V16 b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_EQ_OQ));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_EQ_OQ));
  return static_cast<Mask16>(lo | (hi << 8));
}
inline V16 Select(Mask16 m, V16 if_set, V16 if_clear) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i lo = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m & 0xff), bits), bits);
  const __m256i hi = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m >> 8), bits), bits);
  return {_mm256_blendv_ps(if_clear.lo, if_set.lo, _mm256_castsi256_ps(lo)),
          _mm256_blendv_ps(if_clear.hi, if_set.hi, _mm256_castsi256_ps(hi))};
}
inline LaneMask FirstLanes(int n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm256_cmpgt_epi32(_mm256_set1_epi32(n), index), _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), index), n};
}
// 16 bytes <-> 16 lanes (values 0-255, exact in fp32).
inline V16 LoadBytes(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
inline void StoreBytes(uint8_t* p, V16 a) {
  alignas(32) float tmp[kLanes];
  Store(tmp, a);
  for (int i = 0; i < kLanes; ++i) p[i] = static_cast<uint8_t>(tmp[i]);
}
// Masked-off lanes are neither read nor written (no fault past the end of a buffer).
inline V16 LoadFirst(const float* p, LaneMask m) {
  return {_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)};
}
inline void StoreFirst(float* p, V16 a, LaneMask m) {
  _mm256_maskstore_ps(p, m.lo, a.lo);
  _mm256_maskstore_ps(p + 8, m.hi, a.hi);
}
// bf16 lanes one by one: a CPU without AVX-512 has no bf16 networks (Bf16Supported()), so these
// only run for an AVX2 build on a bf16 CPU; correct, not fast.
inline V16 LoadBf16First(const uint16_t* p, LaneMask m) {
  alignas(32) float tmp[kLanes] = {};
  for (int i = 0; i < m.n; ++i) tmp[i] = nn_internal::Bf16ToF32(p[i]);
  return Load(tmp);
}
inline void StoreBf16First(uint16_t* p, V16 a, LaneMask m) {
  alignas(32) float tmp[kLanes];
  Store(tmp, a);
  for (int i = 0; i < m.n; ++i) p[i] = nn_internal::F32ToBf16(tmp[i]);
}

#endif

// acc[j] += sum over taps of x[row(kd,kh) + w0 + j + kw] * w[tap], for j < NB.
template <int NB>
inline void ConvChunk(const float* x, int64_t s, int k, int d, int h, int w0, const float* wt, V16* acc) {
  for (int kd = 0; kd < k; ++kd) {
    for (int kh = 0; kh < k; ++kh) {
      const float* xr = x + ((d + kd) * s + (h + kh)) * s + w0;
      const float* wr = wt + (kd * k + kh) * k * kLanes;
      for (int kw = 0; kw < k; ++kw) {
        const V16 wv = Load(wr + kw * kLanes);
        for (int j = 0; j < NB; ++j) acc[j] = Fma(xr[j + kw], wv, acc[j]);
      }
    }
  }
}

// Same with the kernel size known at compile time, so the 27 (for 3^3) taps unroll fully.
template <int K, int NB>
inline void ConvChunkK(const float* x, int64_t s, int d, int h, int w0, const float* wt, V16* acc) {
#pragma GCC unroll 8
  for (int kd = 0; kd < K; ++kd) {
#pragma GCC unroll 8
    for (int kh = 0; kh < K; ++kh) {
      const float* xr = x + ((d + kd) * s + (h + kh)) * s + w0;
      const float* wr = wt + (kd * K + kh) * K * kLanes;
#pragma GCC unroll 8
      for (int kw = 0; kw < K; ++kw) {
        const V16 wv = Load(wr + kw * kLanes);
#pragma GCC unroll 16
        for (int j = 0; j < NB; ++j) acc[j] = Fma(xr[j + kw], wv, acc[j]);
      }
    }
  }
}

inline void ConvChunkTail(const float* x, int64_t s, int k, int d, int h, int w0, int nb, const float* wt,
                          V16* acc) {
  for (int kd = 0; kd < k; ++kd) {
    for (int kh = 0; kh < k; ++kh) {
      const float* xr = x + ((d + kd) * s + (h + kh)) * s + w0;
      for (int kw = 0; kw < k; ++kw) {
        const V16 wv = Load(wt + ((kd * k + kh) * k + kw) * kLanes);
        for (int j = 0; j < nb; ++j) acc[j] = Fma(xr[j + kw], wv, acc[j]);
      }
    }
  }
}

// Weight-gradient accumulation over one conv row for NR kernel rows (kd, kh) = (r / K, r % K),
// r = r0 .. r0+NR-1: acc[i*K + kw] += sum_w x[(d+kd, h+kh, w+kw)] * dconv[w]. All accumulators
// stay in registers, so the row is a small matmul (positions x taps) over the input patches.
template <int K, int NR>
inline void GradRows(const float* x, int64_t s, int d, int h, int r0, int width, const float* dconv,
                     float* partial /* [K^3][16] */) {
  V16 acc[NR * K];
  for (int t = 0; t < NR * K; ++t) acc[t] = Zero();
  const float* row0 = x + (int64_t{d} * s + h) * s;
  int64_t offset[NR];  // of each (kd, kh) input row from row0
  for (int i = 0; i < NR; ++i) offset[i] = (int64_t{(r0 + i) / K} * s + (r0 + i) % K) * s;
  for (int w = 0; w < width; ++w) {
    const float* xw = row0 + w;
    // Opaque to the optimiser: without this GCC carries the broadcasts of one position into the
    // next (x[w + kw] is x[(w + 1) + kw - 1]) and spills them to the stack as 64-byte vectors,
    // which made this loop store-bound. A fresh broadcast
    // load per FMA is what the hardware does best.
    asm("" : "+r"(xw));
    const V16 dv = Load(dconv + w * kLanes);
    for (int i = 0; i < NR; ++i) {
      for (int kw = 0; kw < K; ++kw) acc[i * K + kw] = Fma(xw[offset[i] + kw], dv, acc[i * K + kw]);
    }
  }
  float* base = partial + r0 * K * kLanes;
  for (int t = 0; t < NR * K; ++t) Store(base + t * kLanes, Add(Load(base + t * kLanes), acc[t]));
}

template <int K>
void GradRowAllTaps(const float* x, int64_t s, int d, int h, int width, const float* dconv, float* partial) {
  constexpr int kRows = GradRowsPerPass(K);
  static_assert((K * K) % kRows == 0, "passes must cover the K*K kernel rows exactly");
  for (int r0 = 0; r0 < K * K; r0 += kRows) GradRows<K, kRows>(x, s, d, h, r0, width, dconv, partial);
}

void GradRowDispatch(int k, const float* x, int64_t s, int d, int h, int width, const float* dconv,
                     float* partial) {
  switch (k) {
    case 1: GradRowAllTaps<1>(x, s, d, h, width, dconv, partial); break;
    case 2: GradRowAllTaps<2>(x, s, d, h, width, dconv, partial); break;
    case 3: GradRowAllTaps<3>(x, s, d, h, width, dconv, partial); break;
    case 4: GradRowAllTaps<4>(x, s, d, h, width, dconv, partial); break;
    case 5: GradRowAllTaps<5>(x, s, d, h, width, dconv, partial); break;
    default: assert(false && "kernel size not supported"); break;
  }
}

// acc[j] += the conv of one input channel for nb outputs from w0; the full chunks unrolled.
template <int NB>
inline void ConvChannel(const float* xc, int64_t s, int k, int d, int h, int w0, int nb, const float* wc, V16* acc) {
  if (nb == NB && k == 3) {
    ConvChunkK<3, NB>(xc, s, d, h, w0, wc, acc);
  } else if (nb == NB && k == 2) {
    ConvChunkK<2, NB>(xc, s, d, h, w0, wc, acc);
  } else if (nb == NB && k == 4) {
    ConvChunkK<4, NB>(xc, s, d, h, w0, wc, acc);
  } else if (nb == NB) {
    ConvChunk<NB>(xc, s, k, d, h, w0, wc, acc);
  } else {
    ConvChunkTail(xc, s, k, d, h, w0, nb, wc, acc);
  }
}

// acc[j] = bias + the conv over all c input channels (planes cstride floats apart) of outputs
// w0 .. w0+nb-1 of row (d, h); wt: the filter group's [C][K^3][16] weights. nb <= kChunk; a
// chunk of kChunk / 2 runs unrolled too (the end of a row).
inline void ConvOutputs(const float* x, int64_t cstride, int c, int64_t s, int k, int d, int h, int w0, int nb,
                        const float* wt, V16 bias, V16* acc) {
  for (int j = 0; j < kChunk; ++j) acc[j] = bias;
  const int64_t wstride = int64_t{k} * k * k * kLanes;
  for (int ci = 0; ci < c; ++ci) {
    if (nb == kChunk / 2) {
      ConvChannel<kChunk / 2>(x + ci * cstride, s, k, d, h, w0, nb, wt + ci * wstride, acc);
    } else {
      ConvChannel<kChunk>(x + ci * cstride, s, k, d, h, w0, nb, wt + ci * wstride, acc);
    }
  }
}

using nn_internal::AlignedFloats;
using nn_internal::RoundUp16;
using nn_internal::SumPartialsInThreadOrder;

constexpr float kPositiveCode = 128.f;  // a max-pool code: window index + 128 if the max is > 0

// Where filter group g (16 lanes) of a pooled voxel lives in the output's layout of CS-channel
// blocks (the header's formula): element (ni, voxel, lane) at At(ni, voxel) + lane, `lanes` of them.
struct GroupPlace {
  int64_t blocks = 0, q3 = 0;
  int block = 0, offset = 0, cs = 0, lanes = kLanes;
  int64_t At(int ni, int64_t voxel) const { return ((ni * blocks + block) * q3 + voxel) * cs + offset; }
};

GroupPlace PlaceOf(int cs, int f, int g, int q) {
  GroupPlace p;
  p.q3 = int64_t{q} * q * q;
  if (cs == 0) return p;  // planar: no blocks
  p.cs = cs;
  p.blocks = (f + cs - 1) / cs;
  p.block = g * kLanes / cs;
  p.offset = g * kLanes % cs;
  p.lanes = std::min(kLanes, cs - p.offset);
  return p;
}

}  // namespace

bool FirstBlockKernel::Supported(const FirstBlockShape& b) {
  const int ps = b.out_side + b.kernel - 1;
  const bool geometry = b.channels >= 1 && b.channels <= 4 && b.filters >= 1 && b.filters <= 2 * kLanes &&
                        b.kernel >= 1 && b.kernel <= 5 && b.pool >= 1 && b.out_side / b.pool >= 1 &&
                        b.pad_left >= 0 && b.pad_left + b.side <= ps && b.side >= 1;
  // A max pool commutes with the activation only when it is monotonic; its window index must fit
  // a code byte's low 7 bits.
  const bool pool = !b.max_pool || (b.alpha >= 0.f && b.pool * b.pool * b.pool <= 128);
  return geometry && pool;
}

const char* FirstBlockKernel::Isa() { return kIsa; }

FirstBlockKernel::FirstBlockKernel(const FirstBlockShape& b, bool bf16_out, bool training, int channel_stride)
    : sh_(b), n_(b.batch), c_(b.channels), s_(b.side), f_(b.filters), k_(b.kernel), p_(b.pool),
      cs_(channel_stride), o_(b.out_side), alpha_(b.alpha), bf16_(bf16_out), training_(training) {
  assert(Supported(b));
  assert(cs_ == 0 || cs_ == f_ || cs_ == kLanes || (cs_ == 8 && f_ <= 8));
  g_ = (f_ + kLanes - 1) / kLanes;
  q_ = o_ / p_;
  ps_ = o_ + k_ - 1;
  padded_input_ = b.pad_left != 0 || ps_ != s_;
  threads_ = omp_get_max_threads();
  const int64_t taps = int64_t{k_} * k_ * k_, qp = int64_t{q_} * p_;
  const int64_t wt_floats = g_ * c_ * taps * kLanes;
  partial_stride_ = RoundUp16(wt_floats + g_ * kLanes);
  scratch_stride_ = 3 * RoundUp16(qp * kLanes);
  wt_ = AlignedFloats(storage_, wt_floats + g_ * kLanes + threads_ * (partial_stride_ + scratch_stride_));
  bias16_ = wt_ + wt_floats;
  partial_ = bias16_ + g_ * kLanes;
  scratch_ = partial_ + threads_ * partial_stride_;
  if (training_ && b.max_pool) codes_.assign(static_cast<size_t>(n_) * q_ * q_ * q_ * g_ * kLanes, 0);
  if (training_ && !b.max_pool) mask_.assign(static_cast<size_t>(n_) * qp * qp * qp * g_, 0);
  if (padded_input_) padded_.assign(static_cast<size_t>(c_) * ps_ * ps_ * ps_, 0.f);
}

double FirstBlockKernel::ConvFlops() const {
  return 2.0 * k_ * k_ * k_ * c_ * f_ * double(o_) * o_ * o_ * n_;
}

int64_t FirstBlockKernel::WorkspaceBytes() const {
  return static_cast<int64_t>(mask_.size() * sizeof(uint16_t) + codes_.size() + padded_.size() * sizeof(float) +
                              storage_.size() * sizeof(float));
}

const float* FirstBlockKernel::Sample(const float* src, int ni) {
  const int64_t s = s_, s3 = s * s * s, ps = ps_, ps3 = ps * ps * ps;
  const float* in = src + ni * c_ * s3;
  if (!padded_input_) return in;
  // Only the cells that hold input are written: the zero borders stay from construction.
  float* pad = padded_.data();
  const int pl = sh_.pad_left;
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t r = 0; r < c_ * s; ++r) {
    const int64_t ci = r / s, d = r % s;
    for (int64_t h = 0; h < s; ++h) {
      std::memcpy(pad + ci * ps3 + ((d + pl) * ps + h + pl) * ps + pl, in + ci * s3 + (d * s + h) * s,
                  sizeof(float) * s);
    }
  }
  return pad;
}

void FirstBlockKernel::PackWeights(const float* weights, const float* bias) {
  const int taps = k_ * k_ * k_;
  std::memset(wt_, 0, sizeof(float) * (g_ * c_ * taps + g_) * kLanes);
  for (int f = 0; f < f_; ++f) {
    const int g = f / kLanes, lane = f % kLanes;
    for (int ci = 0; ci < c_; ++ci) {
      for (int t = 0; t < taps; ++t) wt_[((g * c_ + ci) * taps + t) * kLanes + lane] = weights[(f * c_ + ci) * taps + t];
    }
    bias16_[f] = bias[f];
  }
}

// The conv row (d, h) of filter group g, through the leaky ReLU (average pool) and into its
// pooling windows: pacc holds the row's q window sums or maxima, pidx the maxima's window indices.
void FirstBlockKernel::PoolConvRow(const float* x, int ni, int d, int h, int g, float* pacc, float* pidx) {
  const int p = p_, qp = q_ * p_, taps = k_ * k_ * k_;
  const int64_t ps = ps_, cstride = ps * ps * ps;
  const V16 bias = Load(bias16_ + g * kLanes), alpha_v = Set1(alpha_);
  const float* wt = wt_ + int64_t{g} * c_ * taps * kLanes;
  uint16_t* mrow = mask_.empty() ? nullptr : mask_.data() + ((int64_t{ni} * qp + d) * qp + h) * qp * g_ + g;
  const int window0 = ((d % p) * p + h % p) * p;  // window index of this row's first voxel
  for (int w0 = 0, nb; w0 < qp; w0 += nb) {
    nb = qp - w0 >= kChunk ? kChunk : qp - w0 >= kChunk / 2 ? kChunk / 2 : qp - w0;
    V16 acc[kChunk];
    ConvOutputs(x, cstride, c_, ps, k_, d, h, w0, nb, wt, bias, acc);
    for (int j = 0; j < nb; ++j) {
      const int w = w0 + j;
      float* slot = pacc + (w / p) * kLanes;
      if (sh_.max_pool) {
        const V16 old = Load(slot);
        const Mask16 gt = Greater(acc[j], old);
        Store(slot, Select(gt, acc[j], old));
        float* idx = pidx + (w / p) * kLanes;
        if (training_) Store(idx, Select(gt, Set1(static_cast<float>(window0 + w % p)), Load(idx)));
      } else {
        const Mask16 pos = Positive(acc[j]);
        if (mrow) mrow[int64_t{w} * g_] = pos;
        Store(slot, Add(Load(slot), Select(pos, acc[j], Mul(acc[j], alpha_v))));
      }
    }
  }
}

// Writes pooled row (qd, qh) of group g: the window means (average) or the activated maxima, and
// for a max pool in training each output's code byte.
void FirstBlockKernel::StorePooledRow(int ni, int qd, int qh, int g, float* pacc, const float* pidx, void* dst) {
  const int q = q_;
  const int64_t q3 = int64_t{q} * q * q, voxel0 = (int64_t{qd} * q + qh) * q;
  const V16 scale = Set1(1.f / static_cast<float>(p_ * p_ * p_)), alpha_v = Set1(alpha_);
  for (int qw = 0; qw < q; ++qw) {
    V16 v = Load(pacc + qw * kLanes);
    if (sh_.max_pool) {
      const Mask16 pos = Positive(v);
      v = Select(pos, v, Mul(v, alpha_v));
      if (training_) {
        const V16 idx = Load(pidx + qw * kLanes);
        StoreBytes(codes_.data() + ((ni * q3 + voxel0 + qw) * g_ + g) * kLanes,
                   Select(pos, Add(idx, Set1(kPositiveCode)), idx));
      }
    } else {
      v = Mul(v, scale);
    }
    Store(pacc + qw * kLanes, v);
  }
  // Unused filter lanes hold exact zeros (zero weights and bias), as padded blocked layouts require.
  const GroupPlace place = PlaceOf(cs_, f_, g, q);
  const LaneMask lanes = FirstLanes(place.lanes);
  for (int qw = 0; qw < q; ++qw) {
    const V16 v = Load(pacc + qw * kLanes);
    const int64_t voxel = voxel0 + qw;
    if (cs_ == 0) {  // planar NCDHW: scatter the filter lanes into their planes
      alignas(64) float tmp[kLanes];
      Store(tmp, v);
      for (int lane = 0; lane < kLanes && g * kLanes + lane < f_; ++lane) {
        const int64_t at = (int64_t{ni} * f_ + g * kLanes + lane) * q3 + voxel;
        if (bf16_) {
          static_cast<uint16_t*>(dst)[at] = nn_internal::F32ToBf16(tmp[lane]);
        } else {
          static_cast<float*>(dst)[at] = tmp[lane];
        }
      }
      continue;
    }
    const int64_t at = place.At(ni, voxel);
    if (bf16_) {
      StoreBf16First(static_cast<uint16_t*>(dst) + at, v, lanes);
    } else {
      StoreFirst(static_cast<float*>(dst) + at, v, lanes);
    }
  }
}

void FirstBlockKernel::ForwardRow(const float* x, int ni, int qd, int qh, float* pacc, float* pidx, void* dst) {
  const int q = q_, p = p_;
  const float init = sh_.max_pool ? -std::numeric_limits<float>::infinity() : 0.f;
  for (int g = 0; g < g_; ++g) {
    for (int i = 0; i < q * kLanes; ++i) {
      pacc[i] = init;
      pidx[i] = 0.f;
    }
    for (int pd = 0; pd < p; ++pd) {
      for (int ph = 0; ph < p; ++ph) PoolConvRow(x, ni, qd * p + pd, qh * p + ph, g, pacc, pidx);
    }
    StorePooledRow(ni, qd, qh, g, pacc, pidx, dst);
  }
}

void FirstBlockKernel::Forward(const float* src, const float* weights, const float* bias, void* dst) {
  PackWeights(weights, bias);
  const int64_t rows = int64_t{q_} * q_, q = q_;
  for (int ni = 0; ni < n_; ++ni) {
    const float* x = Sample(src, ni);
#pragma omp parallel num_threads(threads_)
    {
      float* pacc = scratch_ + omp_get_thread_num() * scratch_stride_;
      float* pidx = pacc + scratch_stride_ / 3;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        ForwardRow(x, ni, static_cast<int>(r / q), static_cast<int>(r % q), pacc, pidx, dst);
      }
    }
  }
}

// dLoss/dconv of conv row (d, h), filter group g, into dconv (q * p positions x 16 lanes), from
// the pooled gradient and the forward's masks or codes; adds the row's sum to bias_acc.
void FirstBlockKernel::DconvRow(const void* diff_dst, int ni, int d, int h, int g, float* dconv, float* bias_acc) {
  const int q = q_, p = p_, qp = q_ * p_;
  const int64_t q3 = int64_t{q} * q * q, voxel0 = (int64_t{d / p} * q + h / p) * q;
  const GroupPlace place = PlaceOf(cs_, f_, g, q);
  const LaneMask lanes = FirstLanes(place.lanes);
  const V16 alpha_v = Set1(alpha_), scale = Set1(1.f / static_cast<float>(p * p * p));
  const uint16_t* mrow = mask_.empty() ? nullptr : mask_.data() + ((int64_t{ni} * qp + d) * qp + h) * qp * g_ + g;
  const int window0 = ((d % p) * p + h % p) * p;
  V16 bsum = Load(bias_acc);
  for (int qw = 0; qw < q; ++qw) {
    const int64_t voxel = voxel0 + qw;
    V16 gv;
    if (cs_ == 0) {  // planar NCDHW: gather the filter lanes from their planes
      alignas(64) float tmp[kLanes] = {};
      for (int lane = 0; lane < kLanes && g * kLanes + lane < f_; ++lane) {
        const int64_t at = (int64_t{ni} * f_ + g * kLanes + lane) * q3 + voxel;
        tmp[lane] = bf16_ ? nn_internal::Bf16ToF32(static_cast<const uint16_t*>(diff_dst)[at])
                          : static_cast<const float*>(diff_dst)[at];
      }
      gv = Load(tmp);
    } else {
      const int64_t at = place.At(ni, voxel);
      gv = bf16_ ? LoadBf16First(static_cast<const uint16_t*>(diff_dst) + at, lanes)
                 : LoadFirst(static_cast<const float*>(diff_dst) + at, lanes);
    }
    if (sh_.max_pool) {
      // Only the window's maximum receives the gradient, times the activation's slope there.
      const V16 code = LoadBytes(codes_.data() + ((ni * q3 + voxel) * g_ + g) * kLanes);
      const Mask16 pos = Greater(code, Set1(kPositiveCode - 0.5f));
      const V16 idx = Select(pos, Add(code, Set1(-kPositiveCode)), code);
      const V16 gs = Select(pos, gv, Mul(gv, alpha_v));
      for (int pw = 0; pw < p; ++pw) {
        const V16 dv = Select(Equal(idx, Set1(static_cast<float>(window0 + pw))), gs, Zero());
        Store(dconv + (qw * p + pw) * kLanes, dv);
        bsum = Add(bsum, dv);
      }
    } else {
      const V16 gm = Mul(gv, scale), ga = Mul(gm, alpha_v);
      for (int pw = 0; pw < p; ++pw) {
        const int w = qw * p + pw;
        const V16 dv = Select(mrow[int64_t{w} * g_], gm, ga);
        Store(dconv + w * kLanes, dv);
        bsum = Add(bsum, dv);
      }
    }
  }
  Store(bias_acc, bsum);
}

void FirstBlockKernel::BackwardRow(const float* x, const void* diff_dst, int ni, int d, int h, float* dconv,
                                   float* partial, float* bias_acc) {
  const int64_t taps = int64_t{k_} * k_ * k_, cstride = int64_t{ps_} * ps_ * ps_;
  for (int g = 0; g < g_; ++g) {
    DconvRow(diff_dst, ni, d, h, g, dconv, bias_acc + g * kLanes);
    for (int ci = 0; ci < c_; ++ci) {
      GradRowDispatch(k_, x + ci * cstride, ps_, d, h, q_ * p_, dconv, partial + ((g * c_ + ci) * taps) * kLanes);
    }
  }
}

void FirstBlockKernel::BackwardWeights(const float* src, const void* diff_dst, float* grad_w, float* grad_b) {
  assert(training_);
  const int64_t taps = int64_t{k_} * k_ * k_, qp = int64_t{q_} * p_, rows = qp * qp;
  const int64_t bias_at = g_ * c_ * taps * kLanes;  // the bias partials follow the weights'
  std::memset(partial_, 0, sizeof(float) * threads_ * partial_stride_);
  int used_threads = 1;
  for (int ni = 0; ni < n_; ++ni) {
    const float* x = Sample(src, ni);
#pragma omp parallel num_threads(threads_)
    {
      const int tid = omp_get_thread_num();
#pragma omp single
      used_threads = std::max(used_threads, omp_get_num_threads());
      float* mine = partial_ + tid * partial_stride_;
      float* dconv = scratch_ + tid * scratch_stride_;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        BackwardRow(x, diff_dst, ni, static_cast<int>(r / qp), static_cast<int>(r % qp), dconv, mine, mine + bias_at);
      }
    }
  }
  // Sum the partials in thread order (deterministic), then transpose to OIDHW.
  SumPartialsInThreadOrder(partial_, partial_stride_, used_threads);
  for (int f = 0; f < f_; ++f) {
    const int g = f / kLanes, lane = f % kLanes;
    for (int ci = 0; ci < c_; ++ci) {
      for (int t = 0; t < taps; ++t) grad_w[(f * c_ + ci) * taps + t] = partial_[((g * c_ + ci) * taps + t) * kLanes + lane];
    }
    grad_b[f] = partial_[bias_at + f];
  }
}

bool FirstConvWeightGrad::Supported(int in_channels, int filters, int kernel, int stride) {
  return in_channels >= 1 && in_channels <= 4 && filters == kLanes && kernel >= 1 && kernel <= 5 && stride == 1;
}

FirstConvWeightGrad::FirstConvWeightGrad(int batch, int in_channels, int side, int kernel, int pad_left,
                                         int out_side)
    : n_(batch), c_(in_channels), s_(side), k_(kernel), pl_(pad_left), o_(out_side) {
  ps_ = o_ + k_ - 1;
  assert(pl_ >= 0 && pl_ < ps_);
  threads_ = omp_get_max_threads();
  padded_.assign(static_cast<size_t>(n_) * c_ * ps_ * ps_ * ps_, 0.f);
  partial_stride_ = RoundUp16(int64_t{c_} * k_ * k_ * k_ * kLanes + kLanes);
  partial_ = AlignedFloats(storage_, threads_ * partial_stride_);
}

void FirstConvWeightGrad::Run(const float* src, const float* diff_dst, float* grad_w, float* grad_b) {
  const int n = n_, c = c_, s = s_, k = k_, o = o_, ps = ps_;
  const int taps = k * k * k;
  const int64_t ps3 = int64_t{ps} * ps * ps, s3 = int64_t{s} * s * s;
  // Planar, zero-padded copy: each channel's rows contiguous, as the micro-kernel reads them. The
  // borders stay zero from construction (only voxels inside the padded cube that hold input are written).
  float* padded = padded_.data();
  const int lo = pl_, hi = std::min(ps, pl_ + s);  // padded coordinates that hold input
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t r = 0; r < int64_t{n} * (hi - lo); ++r) {
    const int ni = static_cast<int>(r / (hi - lo)), d = lo + static_cast<int>(r % (hi - lo));
    for (int h = lo; h < hi; ++h) {
      const float* in = src + ((int64_t{ni} * s3 + (int64_t{d - pl_} * s + (h - pl_)) * s)) * c;
      for (int w = lo; w < hi; ++w) {
        for (int ci = 0; ci < c; ++ci) {
          padded[(int64_t{ni} * c + ci) * ps3 + (int64_t{d} * ps + h) * ps + w] = in[(w - pl_) * c + ci];
        }
      }
    }
  }

  const int64_t stride = partial_stride_;
  float* partial = partial_;
  std::memset(partial, 0, sizeof(float) * threads_ * stride);
  const int64_t rows = int64_t{n} * o * o;
  int used_threads = 1;
#pragma omp parallel num_threads(threads_)
  {
#pragma omp single
    used_threads = omp_get_num_threads();
    float* mine = partial + omp_get_thread_num() * stride;
    V16 bias_acc = Zero();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int ni = static_cast<int>(r / (int64_t{o} * o));
      const int d = static_cast<int>((r / o) % o), h = static_cast<int>(r % o);
      const float* dconv = diff_dst + r * o * kLanes;  // the row (ni, d, h): o positions x 16 filters
      for (int w = 0; w < o; ++w) bias_acc = Add(bias_acc, Load(dconv + w * kLanes));
      for (int ci = 0; ci < c; ++ci) {
        GradRowDispatch(k, padded + (int64_t{ni} * c + ci) * ps3, ps, d, h, o, dconv,
                        mine + int64_t{ci} * taps * kLanes);
      }
    }
    float* b = mine + int64_t{c} * taps * kLanes;
    Store(b, Add(Load(b), bias_acc));
  }
  SumPartialsInThreadOrder(partial, stride, used_threads);
  for (int f = 0; f < kLanes; ++f) {
    for (int ci = 0; ci < c; ++ci) {
      for (int t = 0; t < taps; ++t) grad_w[(f * c + ci) * taps + t] = partial[(ci * taps + t) * kLanes + f];
    }
    grad_b[f] = partial[int64_t{c} * taps * kLanes + f];
  }
}

}  // namespace cosmoflow

#else  // neither AVX-512 nor AVX2

namespace cosmoflow {
namespace {

[[noreturn]] void NotBuilt() {
  throw std::logic_error("FirstBlockKernel: built without AVX-512 or AVX2; callers must check Supported()");
}

}  // namespace

bool FirstBlockKernel::Supported(const FirstBlockShape&) { return false; }

const char* FirstBlockKernel::Isa() { return "none"; }

FirstBlockKernel::FirstBlockKernel(const FirstBlockShape&, bool, bool, int) { NotBuilt(); }

double FirstBlockKernel::ConvFlops() const { NotBuilt(); }

int64_t FirstBlockKernel::WorkspaceBytes() const { NotBuilt(); }

void FirstBlockKernel::Forward(const float*, const float*, const float*, void*) { NotBuilt(); }

void FirstBlockKernel::BackwardWeights(const float*, const void*, float*, float*) { NotBuilt(); }

bool FirstConvWeightGrad::Supported(int, int, int, int) { return false; }

FirstConvWeightGrad::FirstConvWeightGrad(int, int, int, int, int, int) { NotBuilt(); }

void FirstConvWeightGrad::Run(const float*, const float*, float*, float*) { NotBuilt(); }

}  // namespace cosmoflow

#endif
