#include "core/nn/kernels/conv_wgrad.h"

#include <stdexcept>

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "core/nn/network_internal.h"

namespace cosmoflow {
namespace {

// part[j][c] (row stride `ldp`) += sum over rows x len positions of dy[j] * x[c], for 4 filters j
// and 16 input channels c. x and dy advance by their position steps along a row and by their row
// steps between rows. The eight accumulators live in registers for the whole rectangle: per
// position 2 loads, 4 broadcasts and 8 FMAs (FMA-bound on two FMA pipes). They are eight named
// variables because GCC 12 kept an accumulator array on the stack, storing it back on every
// position (less than half the speed), and the asm barrier keeps it from folding the x loads
// into every FMA (12 loads per 8 FMAs).
void AccumulateTap(const float* x, int64_t x_pos, int64_t x_row, const float* dy, int64_t dy_pos, int64_t dy_row,
                   int rows, int len, float* part, int64_t ldp) {
  // Accumulator 2j + h holds filter j, channels 8h .. 8h + 7.
  auto at = [&](int i) { return part + (i / 2) * ldp + (i % 2) * 8; };
  __m256 a0 = _mm256_loadu_ps(at(0)), a1 = _mm256_loadu_ps(at(1)), a2 = _mm256_loadu_ps(at(2)),
         a3 = _mm256_loadu_ps(at(3)), a4 = _mm256_loadu_ps(at(4)), a5 = _mm256_loadu_ps(at(5)),
         a6 = _mm256_loadu_ps(at(6)), a7 = _mm256_loadu_ps(at(7));
  for (int r = 0; r < rows; ++r) {
    const float* xp = x + r * x_row;
    const float* dp = dy + r * dy_row;
    for (int p = 0; p < len; ++p, xp += x_pos, dp += dy_pos) {
      __m256 x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + 8);
      asm("" : "+x"(x0), "+x"(x1));
      __m256 g = _mm256_broadcast_ss(dp);
      a0 = _mm256_fmadd_ps(g, x0, a0);
      a1 = _mm256_fmadd_ps(g, x1, a1);
      g = _mm256_broadcast_ss(dp + 1);
      a2 = _mm256_fmadd_ps(g, x0, a2);
      a3 = _mm256_fmadd_ps(g, x1, a3);
      g = _mm256_broadcast_ss(dp + 2);
      a4 = _mm256_fmadd_ps(g, x0, a4);
      a5 = _mm256_fmadd_ps(g, x1, a5);
      g = _mm256_broadcast_ss(dp + 3);
      a6 = _mm256_fmadd_ps(g, x0, a6);
      a7 = _mm256_fmadd_ps(g, x1, a7);
    }
  }
  _mm256_storeu_ps(at(0), a0);
  _mm256_storeu_ps(at(1), a1);
  _mm256_storeu_ps(at(2), a2);
  _mm256_storeu_ps(at(3), a3);
  _mm256_storeu_ps(at(4), a4);
  _mm256_storeu_ps(at(5), a5);
  _mm256_storeu_ps(at(6), a6);
  _mm256_storeu_ps(at(7), a7);
}

// All filters and channels of one tap over one output-plane rectangle, in 4 x 16 tiles.
void AccumulateTapAllTiles(int c, int f, const float* x, int64_t x_row, const float* dy, int64_t dy_row, int rows,
                           int len, float* part) {
  for (int fb = 0; fb < f; fb += 4) {
    for (int cb = 0; cb < c; cb += 16) {
      AccumulateTap(x + cb, c, x_row, dy + fb, f, dy_row, rows, len, part + int64_t{fb} * c + cb, c);
    }
  }
}

// The same with the roles swapped, for 4 input channels: the 4 channels are broadcast and 16
// filters fill two vectors; `part` is then [C][F] (4 rows of F).
void AccumulateTapFourChannels(int c, int f, const float* x, int64_t x_row, const float* dy, int64_t dy_row,
                               int rows, int len, float* part) {
  for (int fb = 0; fb < f; fb += 16) {
    AccumulateTap(dy + fb, f, dy_row, x, c, x_row, rows, len, part + fb, f);
  }
}

}  // namespace

bool ChannelsLastWeightGrad::Supported(int in_channels, int filters, int stride) {
  // Tiles of 4 filters x 16 channels, or 4 channels x 16 filters. (oneDNN 2.6 has direct AVX2
  // kernels for the 8-channel shapes tried, on blocked layouts.)
  return stride == 1 && in_channels > 0 && filters > 0 &&
         ((in_channels % 16 == 0 && filters % 4 == 0) || (in_channels == 4 && filters % 16 == 0));
}

ChannelsLastWeightGrad::ChannelsLastWeightGrad(int batch, int in_channels, int filters, int side, int kernel,
                                               int pad_left, int out_side)
    : n_(batch), c_(in_channels), f_(filters), s_(side), k_(kernel), pl_(pad_left), o_(out_side) {
  assert(Supported(c_, f_, 1) && k_ >= 1 && pl_ >= 0);
  threads_ = omp_get_max_threads();
  partial_stride_ = nn_internal::RoundUp16(int64_t{k_} * k_ * k_ * f_ * c_ + f_);
  partial_ = nn_internal::AlignedFloats(storage_, threads_ * partial_stride_);
}

void ChannelsLastWeightGrad::Run(const float* src, const float* diff_dst, float* grad_w, float* grad_b) {
  const int n = n_, c = c_, f = f_, s = s_, k = k_, pl = pl_, o = o_;
  const int taps = k * k * k;
  const int64_t stride = partial_stride_;
  float* partial = partial_;
  std::memset(partial, 0, sizeof(float) * threads_ * stride);
  // 4 filters x 16 channels, partials [tap][F][C]; with 4 channels, 4 channels x 16 filters and
  // partials [tap][C][F].
  const bool four = c == 4;
  auto tiles = four ? AccumulateTapFourChannels : AccumulateTapAllTiles;
  const int64_t planes = int64_t{n} * o;
  const int64_t x_row = int64_t{s} * c, dy_row = int64_t{o} * f;
  int used_threads = 1;
#pragma omp parallel num_threads(threads_)
  {
#pragma omp single
    used_threads = omp_get_num_threads();
    float* mine = partial + omp_get_thread_num() * stride;
    float* bias = mine + int64_t{taps} * f * c;
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < planes; ++plane) {
      const int ni = static_cast<int>(plane / o), od = static_cast<int>(plane % o);
      const float* dy_plane = diff_dst + plane * o * dy_row;
      for (int64_t p = 0; p < int64_t{o} * o; ++p) {
        for (int j = 0; j < f; ++j) bias[j] += dy_plane[p * f + j];
      }
      for (int kd = 0; kd < k; ++kd) {
        const int id = od + kd - pl;
        if (id < 0 || id >= s) continue;
        // Output rows/columns whose input row/column (o + kh - pl) lies inside the cube: the
        // padding contributes zeros.
        for (int kh = 0; kh < k; ++kh) {
          const int oh_lo = std::max(0, pl - kh), oh_hi = std::min(o, s + pl - kh);
          if (oh_lo >= oh_hi) continue;
          for (int kw = 0; kw < k; ++kw) {
            const int ow_lo = std::max(0, pl - kw), ow_hi = std::min(o, s + pl - kw);
            if (ow_lo >= ow_hi) continue;
            const float* x = src + ((int64_t{ni} * s + id) * s + (oh_lo + kh - pl)) * x_row +
                             int64_t{ow_lo + kw - pl} * c;
            const float* dy = dy_plane + (int64_t{oh_lo} * o + ow_lo) * f;
            tiles(c, f, x, x_row, dy, dy_row, oh_hi - oh_lo, ow_hi - ow_lo,
                  mine + int64_t{(kd * k + kh) * k + kw} * f * c);
          }
        }
      }
    }
  }
  nn_internal::SumPartialsInThreadOrder(partial, stride, used_threads);
  for (int j = 0; j < f; ++j) {
    for (int ci = 0; ci < c; ++ci) {
      for (int t = 0; t < taps; ++t) {
        grad_w[(int64_t{j} * c + ci) * taps + t] =
            four ? partial[(int64_t{t} * c + ci) * f + j] : partial[(int64_t{t} * f + j) * c + ci];
      }
    }
    grad_b[j] = partial[int64_t{taps} * f * c + j];
  }
}

}  // namespace cosmoflow

#else  // no AVX2 + FMA

namespace cosmoflow {

bool ChannelsLastWeightGrad::Supported(int, int, int) { return false; }

ChannelsLastWeightGrad::ChannelsLastWeightGrad(int, int, int, int, int, int, int) {
  throw std::logic_error("ChannelsLastWeightGrad: built without AVX2 + FMA; callers must check Supported()");
}

void ChannelsLastWeightGrad::Run(const float*, const float*, float*, float*) {
  throw std::logic_error("ChannelsLastWeightGrad: built without AVX2 + FMA; callers must check Supported()");
}

}  // namespace cosmoflow

#endif
