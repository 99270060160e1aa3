#include "core/nn/first_block.h"

#include <stdexcept>

// The kernel is written in AVX-512 intrinsics and is built only when the compiler targets AVX-512
// (the default build is -march=native). Elsewhere Supported() is false and the network runs the
// block as oneDNN's convolution + eltwise + pooling; the other members then only report misuse.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define COSMOFLOW_FIRST_BLOCK_AVX512 1
#endif

#ifdef COSMOFLOW_FIRST_BLOCK_AVX512

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "core/nn/network_internal.h"

namespace cosmoflow {
namespace {

constexpr int kLanes = 16;  // one zmm of fp32 = up to 16 filters
constexpr int kChunk = 8;   // conv outputs per forward micro-kernel call (8 accumulators)

inline __m512 LoadBf16(const uint16_t* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void StoreBf16(uint16_t* p, __m512 v, __mmask16 m) {
#ifdef __AVX512BF16__
  __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
  // Round to nearest even by integer arithmetic (finite values only: activations are finite).
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
#endif
  _mm256_mask_storeu_epi16(p, m, h);
}

// acc[j] = bias + sum over taps of x[row(kd,kh) + w0 + j + kw] * w[tap], for j < nb.
template <int NB>
inline void ConvChunk(const float* x, int64_t s, int k, int d, int h, int w0, const float* wt, __m512 bias,
                      __m512* acc) {
  for (int j = 0; j < NB; ++j) acc[j] = bias;
  for (int kd = 0; kd < k; ++kd) {
    for (int kh = 0; kh < k; ++kh) {
      const float* xr = x + ((d + kd) * s + (h + kh)) * s + w0;
      const float* wr = wt + (kd * k + kh) * k * kLanes;
      for (int kw = 0; kw < k; ++kw) {
        __m512 wv = _mm512_load_ps(wr + kw * kLanes);
        for (int j = 0; j < NB; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(xr[j + kw]), wv, acc[j]);
      }
    }
  }
}

// Same with the kernel size known at compile time, so the 27 (for 3^3) taps unroll fully.
template <int K, int NB>
inline void ConvChunkK(const float* x, int64_t s, int d, int h, int w0, const float* wt, __m512 bias,
                       __m512* acc) {
  for (int j = 0; j < NB; ++j) acc[j] = bias;
#pragma GCC unroll 8
  for (int kd = 0; kd < K; ++kd) {
#pragma GCC unroll 8
    for (int kh = 0; kh < K; ++kh) {
      const float* xr = x + ((d + kd) * s + (h + kh)) * s + w0;
      const float* wr = wt + (kd * K + kh) * K * kLanes;
#pragma GCC unroll 8
      for (int kw = 0; kw < K; ++kw) {
        const __m512 wv = _mm512_load_ps(wr + kw * kLanes);
#pragma GCC unroll 16
        for (int j = 0; j < NB; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(xr[j + kw]), wv, acc[j]);
      }
    }
  }
}

inline void ConvChunkTail(const float* x, int64_t s, int k, int d, int h, int w0, int nb, const float* wt,
                          __m512 bias, __m512* acc) {
  for (int j = 0; j < nb; ++j) acc[j] = bias;
  for (int kd = 0; kd < k; ++kd) {
    for (int kh = 0; kh < k; ++kh) {
      const float* xr = x + ((d + kd) * s + (h + kh)) * s + w0;
      for (int kw = 0; kw < k; ++kw) {
        __m512 wv = _mm512_load_ps(wt + ((kd * k + kh) * k + kw) * kLanes);
        for (int j = 0; j < nb; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(xr[j + kw]), wv, acc[j]);
      }
    }
  }
}

// Weight-gradient accumulation over one conv row: for a group of G kd-slices starting at kd0,
// acc[(g*K + kh)*K + kw] += sum_w x[(d+kd0+g, h+kh, w+kw)] * dconv[w]. All accumulators stay in
// registers (27 for K=3), so the row is a small matmul (positions x taps) over the input patches.
template <int K, int G>
inline void GradRow(const float* x, int64_t s, int d, int h, int kd0, int width, const float* dconv,
                    float* partial /* [K^3][16] */) {
  constexpr int kNt = G * K * K;
  __m512 acc[kNt];
  for (int t = 0; t < kNt; ++t) acc[t] = _mm512_setzero_ps();
  const float* row0 = x + ((d + kd0) * s + h) * s;
  int64_t offset[G * K];  // of each (kd, kh) input row from row0
  for (int g = 0; g < G; ++g) {
    for (int kh = 0; kh < K; ++kh) offset[g * K + kh] = (g * s + kh) * s;
  }
  for (int w = 0; w < width; ++w) {
    const float* xw = row0 + w;
    // Opaque to the optimiser: without this GCC carries the broadcasts of one position into the
    // next (x[w + kw] is x[(w + 1) + kw - 1]) and spills them to the stack as 64-byte vectors,
    // which made this loop store-bound (177 GFLOP/s for sc18's conv0 backward). A fresh broadcast
    // load per FMA is what the hardware does best.
    asm("" : "+r"(xw));
    const __m512 dv = _mm512_load_ps(dconv + w * kLanes);
    for (int r = 0; r < G * K; ++r) {
      for (int kw = 0; kw < K; ++kw) {
        acc[r * K + kw] = _mm512_fmadd_ps(_mm512_set1_ps(xw[offset[r] + kw]), dv, acc[r * K + kw]);
      }
    }
  }
  float* base = partial + kd0 * K * K * kLanes;
  for (int t = 0; t < kNt; ++t) {
    _mm512_store_ps(base + t * kLanes, _mm512_add_ps(_mm512_load_ps(base + t * kLanes), acc[t]));
  }
}

void GradRowDispatch(int k, const float* x, int64_t s, int d, int h, int width, const float* dconv,
                     float* partial) {
  switch (k) {
    case 1: GradRow<1, 1>(x, s, d, h, 0, width, dconv, partial); break;
    case 2: GradRow<2, 2>(x, s, d, h, 0, width, dconv, partial); break;
    case 3: GradRow<3, 3>(x, s, d, h, 0, width, dconv, partial); break;
    case 4:
      for (int kd = 0; kd < 4; ++kd) GradRow<4, 1>(x, s, d, h, kd, width, dconv, partial);
      break;
    case 5:
      for (int kd = 0; kd < 5; ++kd) GradRow<5, 1>(x, s, d, h, kd, width, dconv, partial);
      break;
    default: assert(false && "kernel size not supported"); break;
  }
}

int64_t RoundUp16(int64_t x) { return (x + 15) / 16 * 16; }

}  // namespace

bool FirstBlockKernel::Supported(int side, int filters, int kernel, int stride, bool same_padding, int pool) {
  return filters >= 1 && filters <= kLanes && kernel >= 1 && kernel <= 5 && stride == 1 && !same_padding &&
         pool >= 1 && side >= kernel && (side - kernel + 1) / pool >= 1;
}

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
  storage_.assign(wt_floats + partial_floats + threads_ * scratch_stride_ + 16, 0.f);
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage_.data()) + 63) & ~uintptr_t{63});
  wt_ = base;
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
  const __mmask16 smask = static_cast<__mmask16>((1u << cs) - 1u);
  const int64_t q3 = int64_t{q} * q * q;
  uint16_t* mask = training ? mask_.data() : nullptr;
  const int64_t rows = int64_t{n} * q * q;

  float* scratch = scratch_;
  const int64_t scratch_stride = scratch_stride_;
#pragma omp parallel num_threads(threads_)
  {
    float* pacc = scratch + omp_get_thread_num() * scratch_stride;
    const __m512 bias_v = _mm512_load_ps(bias16);
    const __m512 alpha_v = _mm512_set1_ps(alpha);
    const __m512 zero = _mm512_setzero_ps();
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
            __m512 acc[kChunk];
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
              __mmask16 pos = _mm512_cmp_ps_mask(acc[j], zero, _CMP_GT_OQ);
              __m512 act = _mm512_mask_blend_ps(pos, _mm512_mul_ps(acc[j], alpha_v), acc[j]);
              if (training) mrow[w0 + j] = pos;
              float* pa = pacc + ((w0 + j) / p) * kLanes;
              _mm512_store_ps(pa, _mm512_add_ps(_mm512_load_ps(pa), act));
            }
          }
        }
      }
      const int64_t out_base = ((int64_t{ni} * q + qd) * q + qh) * q;
      for (int qw = 0; qw < q; ++qw) {
        __m512 v = _mm512_mul_ps(_mm512_load_ps(pacc + qw * kLanes), _mm512_set1_ps(inv));
        // Unused filter lanes hold exact zeros (zero weights and bias), as the padded
        // nCdhw16c layout requires.
        if (cs == 0) {  // planar NCDHW: scatter the filter lanes into their planes
          alignas(64) float tmp[kLanes];
          _mm512_store_ps(tmp, v);
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
          StoreBf16(static_cast<uint16_t*>(dst) + (out_base + qw) * cs, v, smask);
        } else {
          _mm512_mask_storeu_ps(static_cast<float*>(dst) + (out_base + qw) * cs, smask, v);
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
  const __mmask16 fmask = static_cast<__mmask16>((1u << f) - 1u);
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
    const __m512 alpha_v = _mm512_set1_ps(alpha);
    const __m512 inv_v = _mm512_set1_ps(inv);
    __m512 bias_acc = _mm512_setzero_ps();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int ni = static_cast<int>(r / (int64_t{qp} * qp));
      const int d = static_cast<int>((r / qp) % qp);
      const int h = static_cast<int>(r % qp);
      const int64_t g_base = ((int64_t{ni} * q + d / p) * q + h / p) * q;
      const uint16_t* mrow = mask + ((int64_t{ni} * qp + d) * qp + h) * qp;
      for (int qw = 0; qw < q; ++qw) {
        __m512 g;
        if (cs == 0) {  // planar NCDHW: gather the filter lanes from their planes
          alignas(64) float tmp[kLanes] = {};
          const int64_t voxel = g_base - int64_t{ni} * q3 + qw;
          for (int fi = 0; fi < f; ++fi) {
            const int64_t at = (int64_t{ni} * f + fi) * q3 + voxel;
            tmp[fi] = bf16 ? nn_internal::Bf16ToF32(static_cast<const uint16_t*>(diff_dst)[at])
                           : static_cast<const float*>(diff_dst)[at];
          }
          g = _mm512_load_ps(tmp);
        } else {
          g = bf16 ? LoadBf16(static_cast<const uint16_t*>(diff_dst) + (g_base + qw) * cs, fmask)
                   : _mm512_maskz_loadu_ps(fmask, static_cast<const float*>(diff_dst) + (g_base + qw) * cs);
        }
        g = _mm512_mul_ps(g, inv_v);
        const __m512 ga = _mm512_mul_ps(g, alpha_v);
        for (int pw = 0; pw < p; ++pw) {
          const int w = qw * p + pw;
          __m512 dv = _mm512_mask_blend_ps(mrow[w], ga, g);
          _mm512_store_ps(dconv + w * kLanes, dv);
          bias_acc = _mm512_add_ps(bias_acc, dv);
        }
      }
      GradRowDispatch(k, src + static_cast<int64_t>(ni) * s * s * s, s, d, h, qp, dconv, mine);
    }
    _mm512_store_ps(mine + taps * kLanes, _mm512_add_ps(_mm512_load_ps(mine + taps * kLanes), bias_acc));
  }
  // Sum the partials in thread order (deterministic), then transpose to OIDHW.
  for (int t = 1; t < used_threads; ++t) {
    const float* other = partial + static_cast<int64_t>(t) * stride;
    for (int i = 0; i < stride; ++i) partial[i] += other[i];
  }
  for (int fi = 0; fi < f; ++fi) {
    for (int t = 0; t < taps; ++t) grad_w[fi * taps + t] = partial[t * kLanes + fi];
    grad_b[fi] = partial[taps * kLanes + fi];
  }
}

}  // namespace cosmoflow

#else  // !COSMOFLOW_FIRST_BLOCK_AVX512

namespace cosmoflow {
namespace {

[[noreturn]] void NotBuilt() {
  throw std::logic_error("FirstBlockKernel: built without AVX-512; callers must check Supported()");
}

}  // namespace

bool FirstBlockKernel::Supported(int, int, int, int, bool, int) { return false; }

FirstBlockKernel::FirstBlockKernel(int, int, int, int, float, int, bool, bool, int) { NotBuilt(); }

double FirstBlockKernel::ConvFlops() const { NotBuilt(); }

void FirstBlockKernel::Forward(const float*, const float*, const float*, void*) { NotBuilt(); }

void FirstBlockKernel::BackwardWeights(const float*, const float*, const float*, const void*, float*, float*) {
  NotBuilt();
}

}  // namespace cosmoflow

#endif  // COSMOFLOW_FIRST_BLOCK_AVX512
