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

#include <algorithm>
#include <cassert>
#include <cstring>

#include "core/nn/network_internal.h"

namespace cosmoflow {
namespace {

constexpr int kLanes = 16;  // filters per vector: up to 16

using Mask16 = uint16_t;  // bit i = lane i

#ifdef COSMOFLOW_FIRST_BLOCK_AVX512

constexpr const char* kIsa = "avx512";
// Register blocking for 32 zmm: 8 forward accumulators; the weight gradient of a whole 3^3 kernel
// (27 accumulators) per pass over a conv row, one kd-slice per pass for 4^3 and 5^3.
constexpr int kChunk = 8;
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
inline V16 Select(Mask16 m, V16 if_set, V16 if_clear) { return {_mm512_mask_blend_ps(m, if_clear.v, if_set.v)}; }
inline LaneMask FirstLanes(int n) { return {static_cast<__mmask16>((1u << n) - 1u)}; }
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

// acc[j] = bias + sum over taps of x[row(kd,kh) + w0 + j + kw] * w[tap], for j < NB.
template <int NB>
inline void ConvChunk(const float* x, int64_t s, int k, int d, int h, int w0, const float* wt, V16 bias,
                      V16* acc) {
  for (int j = 0; j < NB; ++j) acc[j] = bias;
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
inline void ConvChunkK(const float* x, int64_t s, int d, int h, int w0, const float* wt, V16 bias, V16* acc) {
  for (int j = 0; j < NB; ++j) acc[j] = bias;
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
                          V16 bias, V16* acc) {
  for (int j = 0; j < nb; ++j) acc[j] = bias;
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

using nn_internal::AlignedFloats;
using nn_internal::RoundUp16;
using nn_internal::SumPartialsInThreadOrder;

}  // namespace

bool FirstBlockKernel::Supported(int side, int filters, int kernel, int stride, bool same_padding, int pool) {
  return filters >= 1 && filters <= kLanes && kernel >= 1 && kernel <= 5 && stride == 1 && !same_padding &&
         pool >= 1 && side >= kernel && (side - kernel + 1) / pool >= 1;
}

const char* FirstBlockKernel::Isa() { return kIsa; }

FirstBlockKernel::FirstBlockKernel(int batch, int side, int filters, int kernel, float alpha, int pool,
                                   bool bf16_out, bool training, int channel_stride)
    : n_(batch), s_(side), f_(filters), k_(kernel), p_(pool), cs_(channel_stride), alpha_(alpha),
      bf16_(bf16_out), training_(training) {
  assert(cs_ == 0 || (cs_ >= f_ && cs_ <= kLanes));
  o_ = s_ - k_ + 1;
  q_ = o_ / p_;
  threads_ = omp_get_max_threads();
  const int64_t taps = int64_t{k_} * k_ * k_;
  const int64_t wt_floats = taps * kLanes;
  const int64_t partial_floats = int64_t{threads_} * (taps * kLanes + kLanes);
  scratch_stride_ = RoundUp16(int64_t{q_} * p_ * kLanes);
  wt_ = AlignedFloats(storage_, wt_floats + partial_floats + threads_ * scratch_stride_);
  partial_ = wt_ + wt_floats;
  scratch_ = partial_ + partial_floats;
  if (training_) {
    const int64_t qp = int64_t{q_} * p_;
    mask_.assign(static_cast<size_t>(n_) * qp * qp * qp, 0);
  }
}

double FirstBlockKernel::ConvFlops() const {
  return 2.0 * k_ * k_ * k_ * f_ * double(o_) * o_ * o_ * n_;
}

void FirstBlockKernel::Forward(const float* src, const float* weights, const float* bias, void* dst) {
  const int taps = k_ * k_ * k_;
  // Tap-major, filter-lane weights (zero in unused lanes), refreshed from the master every call.
  float* wt = wt_;
  std::memset(wt, 0, sizeof(float) * taps * kLanes);
  for (int f = 0; f < f_; ++f) {
    for (int t = 0; t < taps; ++t) wt[t * kLanes + f] = weights[f * taps + t];
  }
  alignas(64) float bias16[kLanes] = {};
  for (int f = 0; f < f_; ++f) bias16[f] = bias[f];

  const int n = n_, q = q_, p = p_, f = f_, k = k_;
  const int qp = q * p;
  const int64_t s = s_;
  const float inv = 1.f / static_cast<float>(p * p * p);
  const float alpha = alpha_;
  const bool training = training_, bf16 = bf16_;
  const int cs = cs_;
  const LaneMask smask = FirstLanes(cs);
  const int64_t q3 = int64_t{q} * q * q;
  uint16_t* mask = training ? mask_.data() : nullptr;
  const int64_t rows = int64_t{n} * q * q;

  float* scratch = scratch_;
  const int64_t scratch_stride = scratch_stride_;
#pragma omp parallel num_threads(threads_)
  {
    float* pacc = scratch + omp_get_thread_num() * scratch_stride;
    const V16 bias_v = Load(bias16);
    const V16 alpha_v = Set1(alpha);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int ni = static_cast<int>(r / (int64_t{q} * q));
      const int qd = static_cast<int>((r / q) % q);
      const int qh = static_cast<int>(r % q);
      const float* x = src + static_cast<int64_t>(ni) * s * s * s;
      std::memset(pacc, 0, sizeof(float) * q * kLanes);
      for (int pd = 0; pd < p; ++pd) {
        for (int ph = 0; ph < p; ++ph) {
          const int d = qd * p + pd, h = qh * p + ph;
          uint16_t* mrow = training ? mask + ((int64_t{ni} * qp + d) * qp + h) * qp : nullptr;
          for (int w0 = 0; w0 < qp; w0 += kChunk) {
            const int nb = std::min(kChunk, qp - w0);
            V16 acc[kChunk];
            if (nb == kChunk && k == 3) {
              ConvChunkK<3, kChunk>(x, s, d, h, w0, wt, bias_v, acc);
            } else if (nb == kChunk && k == 2) {
              ConvChunkK<2, kChunk>(x, s, d, h, w0, wt, bias_v, acc);
            } else if (nb == kChunk && k == 4) {
              ConvChunkK<4, kChunk>(x, s, d, h, w0, wt, bias_v, acc);
            } else if (nb == kChunk) {
              ConvChunk<kChunk>(x, s, k, d, h, w0, wt, bias_v, acc);
            } else {
              ConvChunkTail(x, s, k, d, h, w0, nb, wt, bias_v, acc);
            }
            for (int j = 0; j < nb; ++j) {
              const Mask16 pos = Positive(acc[j]);
              const V16 act = Select(pos, acc[j], Mul(acc[j], alpha_v));
              if (training) mrow[w0 + j] = pos;
              float* pa = pacc + ((w0 + j) / p) * kLanes;
              Store(pa, Add(Load(pa), act));
            }
          }
        }
      }
      const int64_t out_base = ((int64_t{ni} * q + qd) * q + qh) * q;
      for (int qw = 0; qw < q; ++qw) {
        const V16 v = Mul(Load(pacc + qw * kLanes), Set1(inv));
        // Unused filter lanes hold exact zeros (zero weights and bias), as the padded
        // nCdhw16c layout requires.
        if (cs == 0) {  // planar NCDHW: scatter the filter lanes into their planes
          alignas(64) float tmp[kLanes];
          Store(tmp, v);
          const int64_t voxel = out_base - int64_t{ni} * q3 + qw;
          for (int fi = 0; fi < f; ++fi) {
            const int64_t at = (int64_t{ni} * f + fi) * q3 + voxel;
            if (bf16) {
              static_cast<uint16_t*>(dst)[at] = nn_internal::F32ToBf16(tmp[fi]);
            } else {
              static_cast<float*>(dst)[at] = tmp[fi];
            }
          }
        } else if (bf16) {
          StoreBf16First(static_cast<uint16_t*>(dst) + (out_base + qw) * cs, v, smask);
        } else {
          StoreFirst(static_cast<float*>(dst) + (out_base + qw) * cs, v, smask);
        }
      }
    }
  }
}

void FirstBlockKernel::BackwardWeights(const float* src, const float* weights, const float* bias,
                                       const void* diff_dst, float* grad_w, float* grad_b) {
  assert(training_);
  const int taps = k_ * k_ * k_;
  const int stride = taps * kLanes + kLanes;  // per-thread partial: weights then bias
  const int threads = threads_;
  float* partial = partial_;
  std::memset(partial, 0, sizeof(float) * threads * stride);
  float* scratch = scratch_;
  const int64_t scratch_stride = scratch_stride_;

  const int n = n_, q = q_, p = p_, f = f_, k = k_;
  const int qp = q * p;
  const int64_t s = s_;
  const LaneMask fmask = FirstLanes(f);
  const float inv = 1.f / static_cast<float>(p * p * p);
  const float alpha = alpha_;
  const bool bf16 = bf16_;
  const int cs = cs_;
  const int64_t q3 = int64_t{q} * q * q;
  const uint16_t* mask = mask_.data();
  const int64_t rows = int64_t{n} * qp * qp;
  int used_threads = 1;

#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
#pragma omp single
    used_threads = omp_get_num_threads();
    float* mine = partial + static_cast<int64_t>(tid) * stride;
    float* dconv = scratch + tid * scratch_stride;
    const V16 alpha_v = Set1(alpha);
    const V16 inv_v = Set1(inv);
    V16 bias_acc = Zero();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int ni = static_cast<int>(r / (int64_t{qp} * qp));
      const int d = static_cast<int>((r / qp) % qp);
      const int h = static_cast<int>(r % qp);
      const int64_t g_base = ((int64_t{ni} * q + d / p) * q + h / p) * q;
      const uint16_t* mrow = mask + ((int64_t{ni} * qp + d) * qp + h) * qp;
      for (int qw = 0; qw < q; ++qw) {
        V16 g;
        if (cs == 0) {  // planar NCDHW: gather the filter lanes from their planes
          alignas(64) float tmp[kLanes] = {};
          const int64_t voxel = g_base - int64_t{ni} * q3 + qw;
          for (int fi = 0; fi < f; ++fi) {
            const int64_t at = (int64_t{ni} * f + fi) * q3 + voxel;
            tmp[fi] = bf16 ? nn_internal::Bf16ToF32(static_cast<const uint16_t*>(diff_dst)[at])
                           : static_cast<const float*>(diff_dst)[at];
          }
          g = Load(tmp);
        } else {
          g = bf16 ? LoadBf16First(static_cast<const uint16_t*>(diff_dst) + (g_base + qw) * cs, fmask)
                   : LoadFirst(static_cast<const float*>(diff_dst) + (g_base + qw) * cs, fmask);
        }
        g = Mul(g, inv_v);
        const V16 ga = Mul(g, alpha_v);
        for (int pw = 0; pw < p; ++pw) {
          const int w = qw * p + pw;
          const V16 dv = Select(mrow[w], g, ga);
          Store(dconv + w * kLanes, dv);
          bias_acc = Add(bias_acc, dv);
        }
      }
      GradRowDispatch(k, src + static_cast<int64_t>(ni) * s * s * s, s, d, h, qp, dconv, mine);
    }
    Store(mine + taps * kLanes, Add(Load(mine + taps * kLanes), bias_acc));
  }
  // Sum the partials in thread order (deterministic), then transpose to OIDHW.
  SumPartialsInThreadOrder(partial, stride, used_threads);
  for (int fi = 0; fi < f; ++fi) {
    for (int t = 0; t < taps; ++t) grad_w[fi * taps + t] = partial[t * kLanes + fi];
    grad_b[fi] = partial[taps * kLanes + fi];
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

bool FirstBlockKernel::Supported(int, int, int, int, bool, int) { return false; }

const char* FirstBlockKernel::Isa() { return "none"; }

FirstBlockKernel::FirstBlockKernel(int, int, int, int, float, int, bool, bool, int) { NotBuilt(); }

double FirstBlockKernel::ConvFlops() const { NotBuilt(); }

void FirstBlockKernel::Forward(const float*, const float*, const float*, void*) { NotBuilt(); }

void FirstBlockKernel::BackwardWeights(const float*, const float*, const float*, const void*, float*, float*) {
  NotBuilt();
}

bool FirstConvWeightGrad::Supported(int, int, int, int) { return false; }

FirstConvWeightGrad::FirstConvWeightGrad(int, int, int, int, int, int) { NotBuilt(); }

void FirstConvWeightGrad::Run(const float*, const float*, float*, float*) { NotBuilt(); }

}  // namespace cosmoflow

#endif
