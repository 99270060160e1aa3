#include "core/nn/kernels/fft_conv.h"

#include <fftw3.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "core/nn/kernels/aligned_floats.h"
#include "core/nn/kernels/vec16.h"

namespace cosmoflow {
namespace {

// FFTW's planner is not thread-safe; networks may be built on several threads of one process.
std::mutex& PlannerMutex() {
  static std::mutex m;
  return m;
}

// Tile sides FFTW transforms fast (split-array r2c of 18^3 runs at half the rate of 16^3).
const int kTiles[] = {8, 12, 16, 20, 24, 32};
// An FFT flop costs about this many flops of the frequency-domain product (FFTW's 3-D transforms
// run well below the FMA rate the product reaches).
constexpr double kFftFlopCost = 4.0;
// The weights' spectra (and the weight gradient's per-thread spectra) must stay cache-friendly and
// within the memory budget: a cap on F * C * T^2 (T/2 + 1) complex values.
constexpr double kMaxSpectrumBytes = 48.0 * 1024 * 1024;

int64_t RoundUp16(int64_t x) { return (x + 15) / 16 * 16; }
int64_t Spectrum(int t) { return int64_t{t} * t * (t / 2 + 1); }

// A split complex array: re and im in one allocation, im a fixed n (rounded up to 16) floats
// after re. FFTW's new-array execute applies a plan to other split arrays only if their im - re
// equals the planned arrays' (FFTW manual, "New-array Execute Functions"); with re and im
// allocated apart, each thread's buffers had their own distance and FFTW went through a wild
// pointer. One allocation per pair makes the distance a function of n alone.
struct Split {
  AlignedFloats both;
  float* re = nullptr;
  float* im = nullptr;
  int64_t n = 0;
  void Allocate(int64_t values) {
    n = values;
    both.Allocate(2 * RoundUp16(values));
    re = both.data();
    im = both.data() + RoundUp16(values);
  }
};

}  // namespace

double FftConv3d::FlopRatio(const Conv3dShape& s, int t) {
  const int to = t - s.kernel + 1;
  if (to < 1) return 0;
  const double nt = std::ceil(double(s.out_side) / to);
  const double tv = double(t) * t * t;
  const double fft = kFftFlopCost * (s.in_channels + s.filters) * 2.5 * tv * std::log2(tv);
  const double product = 8.0 * Spectrum(t) * s.in_channels * s.filters;
  return s.DirectFlops() / (s.batch * nt * nt * nt * (fft + product));
}

int FftConv3d::ChooseTile(const Conv3dShape& s) {
  int best = 0;
  double best_ratio = 1.0;
  for (int t : kTiles) {
    if (t < s.kernel + 1 || t - s.kernel + 1 > s.out_side + s.kernel) continue;
    if (8.0 * s.in_channels * s.filters * RoundUp16(Spectrum(t)) > kMaxSpectrumBytes) continue;
    const double r = FlopRatio(s, t);
    if (r > best_ratio) {
      best_ratio = r;
      best = t;
    }
  }
  return best;
}

int FftConv3d::TileFor(const Conv3dShape& s) {
  if (int t = ChooseTile(s); t > 0) return t;
  for (int t : kTiles) {
    if (t >= s.kernel + 1 && 8.0 * s.in_channels * s.filters * RoundUp16(Spectrum(t)) <= kMaxSpectrumBytes) return t;
  }
  return 0;
}

// Per-thread working memory: real tiles, and the spectra of the input and output tiles (split).
struct FftConv3d::ThreadBuffers {
  AlignedFloats real;          // [tiles][max(C, F)][T^3]
  Split x;               // [tiles][C][tfp]
  Split y;               // [tiles][F][tfp]
  Split g;               // [F][C][tfp], the weight gradient's partial spectrum (lazily)
  std::vector<double> bias;  // [F] partial bias gradient
};

struct FftConv3d::Plans {
  fftwf_plan in_r2c = nullptr;    // tiles * C real tiles -> spectra
  fftwf_plan out_r2c = nullptr;   // tiles * F real tiles -> spectra (output-gradient tiles)
  fftwf_plan out_c2r = nullptr;   // tiles * F spectra -> real tiles
  fftwf_plan w_r2c = nullptr;     // F * C weights -> spectra
  fftwf_plan w_c2r = nullptr;     // F * C gradient spectra -> real
  AlignedFloats w_real;                 // [F][C][T^3]
  Split w;                        // the weights' spectra, [F][C][tfp] (g's size: w_c2r runs on g)
  ~Plans() {
    for (fftwf_plan p : {in_r2c, out_r2c, out_c2r, w_r2c, w_c2r}) {
      if (p != nullptr) fftwf_destroy_plan(p);
    }
  }
};

namespace {

// A plan for `howmany` real T^3 tiles (stride T^3) <-> split spectra (stride tfp).
fftwf_plan PlanR2c(int t, int howmany, int64_t tfp, float* real, float* re, float* im) {
  const int h = t / 2 + 1;
  fftwf_iodim dims[3] = {{t, t * t, t * h}, {t, t, h}, {t, 1, 1}};
  fftwf_iodim many = {howmany, t * t * t, static_cast<int>(tfp)};
  return fftwf_plan_guru_split_dft_r2c(3, dims, 1, &many, real, re, im, FFTW_ESTIMATE);
}
fftwf_plan PlanC2r(int t, int howmany, int64_t tfp, float* re, float* im, float* real) {
  const int h = t / 2 + 1;
  fftwf_iodim dims[3] = {{t, t * h, t * t}, {t, h, t}, {t, 1, 1}};
  fftwf_iodim many = {howmany, static_cast<int>(tfp), t * t * t};
  return fftwf_plan_guru_split_dft_c2r(3, dims, 1, &many, re, im, real, FFTW_ESTIMATE);
}

// y[a][b] (+)= sum_k x[a][k] * conj(w[b][k]) for 2 x 2 (a, b) over 16 frequencies at once:
// (xr + i xi)(wr - i wi) = (xr wr + xi wi) + i (xi wr - xr wi).
inline void ConjProduct2x2(const float* xr0, const float* xi0, const float* xr1, const float* xi1, int64_t xk,
                           const float* wr0, const float* wi0, const float* wr1, const float* wi1, int64_t wk, int k_count,
                           V16* acc) {
  V16 r00 = acc[0], i00 = acc[1], r01 = acc[2], i01 = acc[3], r10 = acc[4], i10 = acc[5], r11 = acc[6], i11 = acc[7];
  for (int k = 0; k < k_count; ++k) {
    const V16 a0r = Load(xr0 + k * xk), a0i = Load(xi0 + k * xk), a1r = Load(xr1 + k * xk), a1i = Load(xi1 + k * xk);
    const V16 b0r = Load(wr0 + k * wk), b0i = Load(wi0 + k * wk), b1r = Load(wr1 + k * wk), b1i = Load(wi1 + k * wk);
    r00 += a0r * b0r + a0i * b0i;
    i00 += a0i * b0r - a0r * b0i;
    r01 += a0r * b1r + a0i * b1i;
    i01 += a0i * b1r - a0r * b1i;
    r10 += a1r * b0r + a1i * b0i;
    i10 += a1i * b0r - a1r * b0i;
    r11 += a1r * b1r + a1i * b1i;
    i11 += a1i * b1r - a1r * b1i;
  }
  acc[0] = r00, acc[1] = i00, acc[2] = r01, acc[3] = i01, acc[4] = r10, acc[5] = i10, acc[6] = r11, acc[7] = i11;
}

// out[a][b][q] (+)= sum_k x[a][k][q] conj(w[b][k][q]) for a < na, b < nb and every frequency q, on
// split arrays: x[a][k] at a * xa + k * xk, w[b][k] at b * wb + k * wk, out[a][b] at
// (a * nb + b) * tfp. An odd last row is paired with itself (the same value is stored twice).
struct Operand {
  const float* re;
  const float* im;
  int64_t row, k;  // strides of the row index and of the summed index
};
void ConjProductAll(const Operand& x, int na, const Operand& w, int nb, int nk, int64_t tfp, float* outr, float* outi,
                    bool accumulate) {
  for (int64_t q = 0; q < tfp; q += 16) {
    for (int a = 0; a < na; a += 2) {
      const int a1 = std::min(a + 1, na - 1);
      for (int b = 0; b < nb; b += 2) {
        const int b1 = std::min(b + 1, nb - 1);
        V16 acc[8] = {};
        const int64_t idx[4] = {(int64_t{a} * nb + b) * tfp + q, (int64_t{a} * nb + b1) * tfp + q,
                                (int64_t{a1} * nb + b) * tfp + q, (int64_t{a1} * nb + b1) * tfp + q};
        if (accumulate) {
          for (int j = 0; j < 4; ++j) acc[2 * j] = Load(outr + idx[j]), acc[2 * j + 1] = Load(outi + idx[j]);
        }
        ConjProduct2x2(x.re + a * x.row + q, x.im + a * x.row + q, x.re + a1 * x.row + q, x.im + a1 * x.row + q, x.k,
                       w.re + b * w.row + q, w.im + b * w.row + q, w.re + b1 * w.row + q, w.im + b1 * w.row + q, w.k, nk,
                       acc);
        for (int j = 3; j >= 0; --j) Store(outr + idx[j], acc[2 * j]), Store(outi + idx[j], acc[2 * j + 1]);
      }
    }
  }
}

}  // namespace

FftConv3d::FftConv3d(const Conv3dShape& shape, int tile, const ActivationLayout& src, const ActivationLayout& dst)
    : s_(shape), t_(tile), src_(src), dst_(dst) {
  to_ = t_ - s_.kernel + 1;
  if (to_ < 1) throw std::invalid_argument("fft conv: tile smaller than the kernel");
  nt_ = (s_.out_side + to_ - 1) / to_;
  tv_ = int64_t{t_} * t_ * t_;
  tfp_ = RoundUp16(Spectrum(t_));
  threads_ = std::max(1, omp_get_max_threads());
  const int64_t tiles = int64_t{s_.batch} * TilesPerSample();
  tiles_per_block_ = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(8, (tiles + threads_ - 1) / threads_)));
  const int tb = tiles_per_block_, C = s_.in_channels, F = s_.filters;
  buffers_ = std::make_unique<ThreadBuffers[]>(threads_);
  for (int i = 0; i < threads_; ++i) {
    ThreadBuffers& b = buffers_[i];
    b.real.Allocate(tb * std::max(C, F) * tv_);
    b.x.Allocate(tb * C * tfp_);
    b.y.Allocate(tb * F * tfp_);
    b.bias.assign(F, 0.0);
  }
  plans_ = std::make_unique<Plans>();
  plans_->w.Allocate(int64_t{F} * C * tfp_);
  plans_->w_real.Allocate(int64_t{F} * C * tv_);
  ThreadBuffers& b0 = buffers_[0];
  std::lock_guard<std::mutex> lock(PlannerMutex());
  plans_->in_r2c = PlanR2c(t_, tb * C, tfp_, b0.real.data(), b0.x.re, b0.x.im);
  plans_->out_r2c = PlanR2c(t_, tb * F, tfp_, b0.real.data(), b0.y.re, b0.y.im);
  plans_->out_c2r = PlanC2r(t_, tb * F, tfp_, b0.y.re, b0.y.im, b0.real.data());
  plans_->w_r2c = PlanR2c(t_, F * C, tfp_, plans_->w_real.data(), plans_->w.re, plans_->w.im);
  plans_->w_c2r = PlanC2r(t_, F * C, tfp_, plans_->w.re, plans_->w.im, plans_->w_real.data());
  for (fftwf_plan p : {plans_->in_r2c, plans_->out_r2c, plans_->out_c2r, plans_->w_r2c, plans_->w_c2r}) {
    if (p == nullptr) throw std::runtime_error("fft conv: FFTW could not plan the tile transforms");
  }
}

FftConv3d::~FftConv3d() = default;

int64_t FftConv3d::WorkspaceBytes() const {
  int64_t floats = 2 * plans_->w.n + plans_->w_real.size();
  for (int i = 0; i < threads_; ++i) {
    const ThreadBuffers& b = buffers_[i];
    floats += b.real.size() + b.x.n * 2 + b.y.n * 2 + b.g.n * 2;
  }
  return floats * 4;
}

void FftConv3d::SetWeights(const float* w, bool flip_transpose) {
  const int C = s_.in_channels, F = s_.filters, k = s_.kernel, k3 = k * k * k;
  float* real = plans_->w_real.data();
  std::memset(real, 0, static_cast<size_t>(F) * C * tv_ * 4);
  for (int f = 0; f < F; ++f) {
    for (int c = 0; c < C; ++c) {
      // flip_transpose: this correlation's filter f is the original's input channel f, and its
      // channel c the original's filter c; taps reversed.
      const float* src = flip_transpose ? w + (int64_t{c} * F + f) * k3 : w + (int64_t{f} * C + c) * k3;
      float* dst = real + (int64_t{f} * C + c) * tv_;
      for (int i = 0; i < k3; ++i) {
        const int tap = flip_transpose ? k3 - 1 - i : i;
        const int d = i / (k * k), h = (i / k) % k, x = i % k;
        dst[(int64_t{d} * t_ + h) * t_ + x] = src[tap];
      }
    }
  }
  fftwf_execute_split_dft_r2c(plans_->w_r2c, real, plans_->w.re, plans_->w.im);
}

// Copies tile `tile`'s region of x into `real` (channels x T^3, zero outside the tensor). Input
// tiles start pad_left before the output tile's origin and span T; output-gradient tiles
// (input = false) start at the origin and span To (the rest of T^3 is zero).
void FftConv3d::Gather(const float* x, const ActivationLayout& layout, int channels, int side, int64_t tile,
                       bool input, float* real) const {
  const int64_t n = tile / TilesPerSample(), r = tile % TilesPerSample();
  const int td = static_cast<int>(r / (int64_t{nt_} * nt_)), th = static_cast<int>(r / nt_ % nt_),
            tw = static_cast<int>(r % nt_);
  const int shift = input ? s_.pad_left : 0, span = input ? t_ : to_;
  const int d0 = td * to_ - shift, h0 = th * to_ - shift, w0 = tw * to_ - shift;
  std::memset(real, 0, static_cast<size_t>(channels) * tv_ * 4);
  const int wlo = std::max(0, -w0), whi = std::min(span, side - w0);
  for (int c = 0; c < channels; ++c) {
    float* rc = real + int64_t{c} * tv_;
    for (int a = 0; a < span; ++a) {
      const int d = d0 + a;
      if (d < 0 || d >= side) continue;
      for (int b = 0; b < span; ++b) {
        const int h = h0 + b;
        if (h < 0 || h >= side) continue;
        const float* row = x + layout.Offset(n, c, (int64_t{d} * side + h) * side + w0);
        float* out = rc + (int64_t{a} * t_ + b) * t_;
        for (int w = wlo; w < whi; ++w) out[w] = row[w * layout.voxel_stride];
      }
    }
  }
}

// The spectra of the input tiles [first, first + count) into b.x (the rest of the block zero).
void FftConv3d::InputSpectra(const float* src, int64_t first, int count, ThreadBuffers& b) const {
  const int C = s_.in_channels;
  for (int i = 0; i < tiles_per_block_; ++i) {
    if (i < count) {
      Gather(src, src_, C, s_.in_side, first + i, true, b.real.data() + int64_t{i} * C * tv_);
    } else {
      std::memset(b.real.data() + int64_t{i} * C * tv_, 0, static_cast<size_t>(C) * tv_ * 4);
    }
  }
  fftwf_execute_split_dft_r2c(plans_->in_r2c, b.real.data(), b.x.re, b.x.im);
}

void FftConv3d::Forward(const float* src, float* dst, const float* bias, float alpha) const {
  const int C = s_.in_channels, F = s_.filters, O = s_.out_side, tb = tiles_per_block_;
  const int64_t tiles = int64_t{s_.batch} * TilesPerSample();
  const int64_t blocks = (tiles + tb - 1) / tb;
  const float scale = 1.f / static_cast<float>(tv_);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    ThreadBuffers& b = buffers_[omp_get_thread_num()];
    const int64_t first = blk * tb;
    const int count = static_cast<int>(std::min<int64_t>(tb, tiles - first));
    InputSpectra(src, first, count, b);
    // y[t][f] = sum_c x[t][c] conj(w[f][c])
    ConjProductAll({b.x.re, b.x.im, C * tfp_, tfp_}, tb, {plans_->w.re, plans_->w.im, C * tfp_, tfp_}, F, C, tfp_, b.y.re,
                   b.y.im, false);
    fftwf_execute_split_dft_c2r(plans_->out_c2r, b.y.re, b.y.im, b.real.data());
    for (int i = 0; i < count; ++i) {
      const int64_t tile = first + i, n = tile / TilesPerSample(), r = tile % TilesPerSample();
      const int od0 = static_cast<int>(r / (int64_t{nt_} * nt_)) * to_, oh0 = static_cast<int>(r / nt_ % nt_) * to_,
                ow0 = static_cast<int>(r % nt_) * to_;
      const int dn = std::min(to_, O - od0), hn = std::min(to_, O - oh0), wn = std::min(to_, O - ow0);
      for (int f = 0; f < F; ++f) {
        const float* yt = b.real.data() + (int64_t{i} * F + f) * tv_;
        const float bf = bias ? bias[f] : 0.f;
        for (int a = 0; a < dn; ++a) {
          for (int c = 0; c < hn; ++c) {
            float* out = dst + dst_.Offset(n, f, (int64_t{od0 + a} * O + oh0 + c) * O + ow0);
            const float* in = yt + (int64_t{a} * t_ + c) * t_;
            for (int w = 0; w < wn; ++w) {
              float v = in[w] * scale + bf;
              if (alpha >= 0.f && v < 0.f) v *= alpha;
              out[w * dst_.voxel_stride] = v;
            }
          }
        }
      }
    }
  }
}

void FftConv3d::BackwardWeights(const float* src, const float* diff_dst, float* grad_w, float* grad_b) const {
  const int C = s_.in_channels, F = s_.filters, O = s_.out_side, k = s_.kernel, tb = tiles_per_block_;
  const int64_t tiles = int64_t{s_.batch} * TilesPerSample();
  const int64_t blocks = (tiles + tb - 1) / tb;
  for (int i = 0; i < threads_; ++i) {
    ThreadBuffers& b = buffers_[i];
    if (b.g.re == nullptr) b.g.Allocate(int64_t{F} * C * tfp_);
    std::memset(b.g.re, 0, static_cast<size_t>(b.g.n) * 4);
    std::memset(b.g.im, 0, static_cast<size_t>(b.g.n) * 4);
    std::fill(b.bias.begin(), b.bias.end(), 0.0);
  }
  // Static schedule: each thread's partial sums cover the same blocks in every run.
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    ThreadBuffers& b = buffers_[omp_get_thread_num()];
    const int64_t first = blk * tb;
    const int count = static_cast<int>(std::min<int64_t>(tb, tiles - first));
    for (int i = 0; i < tb; ++i) {
      float* dy = b.real.data() + int64_t{i} * F * tv_;
      if (i >= count) {
        std::memset(dy, 0, static_cast<size_t>(F) * tv_ * 4);
        continue;
      }
      Gather(diff_dst, dst_, F, O, first + i, false, dy);
      for (int f = 0; f < F; ++f) {
        double s = 0;
        for (int64_t v = 0; v < tv_; ++v) s += dy[f * tv_ + v];
        b.bias[f] += s;
      }
    }
    fftwf_execute_split_dft_r2c(plans_->out_r2c, b.real.data(), b.y.re, b.y.im);
    InputSpectra(src, first, count, b);
    // g[c][f] += sum_t x[t][c] conj(dy[t][f]): the correlation of input and output gradient.
    ConjProductAll({b.x.re, b.x.im, tfp_, C * tfp_}, C, {b.y.re, b.y.im, tfp_, F * tfp_}, F, tb, tfp_, b.g.re,
                   b.g.im, true);
  }
  // Thread order, for reproducibility; then one inverse transform per (f, c).
  ThreadBuffers& b0 = buffers_[0];
  for (int t = 1; t < threads_; ++t) {
    for (int64_t i = 0; i < b0.g.n; ++i) b0.g.re[i] += buffers_[t].g.re[i], b0.g.im[i] += buffers_[t].g.im[i];
    for (int f = 0; f < F; ++f) b0.bias[f] += buffers_[t].bias[f];
  }
  float* real = plans_->w_real.data();
  fftwf_execute_split_dft_c2r(plans_->w_c2r, b0.g.re, b0.g.im, real);
  const float scale = 1.f / static_cast<float>(tv_);
  const int k3 = k * k * k;
  for (int f = 0; f < F; ++f) {
    for (int c = 0; c < C; ++c) {
      const float* g = real + (int64_t{c} * F + f) * tv_;  // the spectra are [c][f]
      for (int i = 0; i < k3; ++i) {
        const int d = i / (k * k), h = (i / k) % k, x = i % k;
        grad_w[(int64_t{f} * C + c) * k3 + i] = g[(int64_t{d} * t_ + h) * t_ + x] * scale;
      }
    }
  }
  if (grad_b != nullptr) {
    for (int f = 0; f < F; ++f) grad_b[f] = static_cast<float>(b0.bias[f]);
  }
}

}  // namespace cosmoflow
