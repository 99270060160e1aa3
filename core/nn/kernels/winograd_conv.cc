#include "core/nn/kernels/winograd_conv.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/nn/kernels/aligned_floats.h"
#include "core/nn/kernels/vec16.h"
#include "core/nn/network_internal.h"

namespace cosmoflow {
namespace {

constexpr int kA = WinogradConv3d::kPoints;
constexpr int kA3 = kA * kA * kA;
// The finite points; infinity is the last. In +-pairs, which halves the transforms' work (the axes
// below). Of the paired sets, +-1/2 gives the smallest fp32 error for every kernel side (3-D,
// random data: 3e-6 for k = 4, 7e-6 for k = 3, 1.6e-5 for k = 2, in units of the output's scale
// sqrt(C k^3); +-2 gives 4e-6 to 2e-5).
constexpr double kPointValues[kA - 1] = {0, 1, -1, 0.5, -0.5};

// Register blocking of the per-point matrix products: rows x (vectors of 16 columns). AVX2: 6 x 16,
// 12 of the 16 ymm registers accumulating (faster than 4 x 16; 3 x 32 was half as fast).
#ifdef __AVX512F__
constexpr int kRows = 6, kMaxVectors = 4;
#else
constexpr int kRows = 6, kMaxVectors = 1;
#endif
// Per-thread tile block: its transformed inputs and outputs should stay in a 1 MiB cache share.
constexpr int64_t kBlockBytes = 1 << 20;

int RoundUp16(int x) { return (x + 15) / 16 * 16; }

constexpr bool kAvx512MicroKernel =
#ifdef __AVX512F__
    true;
#else
    false;
#endif

// Solves for the inverse of the n x n matrix a (row-major) by Gauss-Jordan with partial pivoting.
std::vector<double> Inverse(std::vector<double> a, int n) {
  std::vector<double> inv(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) inv[i * n + i] = 1;
  for (int col = 0; col < n; ++col) {
    int piv = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::fabs(a[r * n + col]) > std::fabs(a[piv * n + col])) piv = r;
    }
    for (int j = 0; j < n; ++j) std::swap(a[col * n + j], a[piv * n + j]), std::swap(inv[col * n + j], inv[piv * n + j]);
    const double d = a[col * n + col];
    for (int j = 0; j < n; ++j) a[col * n + j] /= d, inv[col * n + j] /= d;
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r * n + col];
      for (int j = 0; j < n; ++j) a[r * n + j] -= f * a[col * n + j], inv[r * n + j] -= f * inv[col * n + j];
    }
  }
  return inv;
}

// Evaluation of a polynomial of `len` coefficients at the points (rows), infinity giving the
// leading coefficient: kA x len, row-major.
std::vector<double> Evaluation(int len) {
  std::vector<double> e(static_cast<size_t>(kA) * len, 0.0);
  for (int p = 0; p < kA - 1; ++p) {
    for (int i = 0; i < len; ++i) e[p * len + i] = std::pow(kPointValues[p], i);
  }
  e[(kA - 1) * len + len - 1] = 1;
  return e;
}

// One axis of each transform. The points come in pairs +-a (columns or rows 1, 2 and 3, 4), so a
// row for -a is (even part) - (odd part) where the row for +a is (even part) + (odd part): half the
// multiply-adds of the dense 6 x 6 product. The coefficients are the matrices' own entries;
// CheckPairing verifies at construction that the matrices have this shape.
struct InputAxis {  // B^T: a -> a
  const float* bt;
  void operator()(const V16* x, V16* y) const {
    const float* r = bt;
    y[0] = r[0] * x[0] + r[2] * x[2] + r[4] * x[4];
    for (int i = 1; i <= 3; i += 2) {
      const float* ri = r + i * kA;
      const V16 even = ri[2] * x[2] + ri[4] * x[4], odd = ri[1] * x[1] + ri[3] * x[3];
      y[i] = even + odd;
      y[i + 1] = even - odd;
    }
    y[5] = r[5 * kA + 1] * x[1] + r[5 * kA + 3] * x[3] + r[5 * kA + 5] * x[5];
  }
};

template <int M>
struct OutputAxis {  // A^T: a -> m
  const float* at;
  void operator()(const V16* x, V16* y) const {
    const V16 s1 = x[1] + x[2], t1 = x[1] - x[2], s2 = x[3] + x[4], t2 = x[3] - x[4];
    for (int i = 0; i < M; ++i) {
      const float* ri = at + i * kA;
      y[i] = i % 2 == 0 ? ri[1] * s1 + ri[3] * s2 : ri[1] * t1 + ri[3] * t2;
    }
    y[0] += at[0] * x[0];
    y[M - 1] += at[(M - 1) * kA + 5] * x[5];
  }
};

template <int M>
struct GradientAxis {  // A = (A^T)^T: m -> a
  const float* at;
  void operator()(const V16* x, V16* y) const {
    y[0] = at[0] * x[0];
    for (int col = 1; col <= 3; col += 2) {
      V16 even = at[col] * x[0], odd = at[kA + col] * x[1];
      for (int i = 2; i < M; ++i) {
        if (i % 2 == 0) even += at[i * kA + col] * x[i];
        else odd += at[i * kA + col] * x[i];
      }
      y[col] = even + odd;
      y[col + 1] = even - odd;
    }
    y[5] = at[(M - 1) * kA + 5] * x[M - 1];
  }
};

// Whether the Toom-Cook matrices have the shape the axes above assume: B^T (a x a) and A^T (m x a),
// with zeros where the axes skip entries and the +-a rows or columns related by the sign of odd
// powers. The points fix this shape; the check keeps a change of points from going unnoticed.
bool CheckPairing(const std::vector<float>& bt, const std::vector<float>& at, int m) {
  auto zero = [](float v) { return std::fabs(v) < 1e-9f; };
  auto same = [](float a, float b) { return std::fabs(a - b) <= 1e-6f * (1 + std::fabs(a)); };
  const int row0[] = {1, 3, 5}, row5[] = {0, 2, 4};
  for (int j : row0) if (!zero(bt[j])) return false;
  for (int j : row5) if (!zero(bt[5 * kA + j])) return false;
  for (int i = 1; i <= 3; i += 2) {
    if (!zero(bt[i * kA]) || !zero(bt[i * kA + 5]) || !zero(bt[(i + 1) * kA]) || !zero(bt[(i + 1) * kA + 5])) return false;
    for (int j = 1; j <= 4; ++j) {
      if (!same(bt[(i + 1) * kA + j], j % 2 == 0 ? bt[i * kA + j] : -bt[i * kA + j])) return false;
    }
  }
  for (int i = 0; i < m; ++i) {
    const float* r = at.data() + i * kA;
    const float sign = i % 2 == 0 ? 1.f : -1.f;
    if (!same(r[2], sign * r[1]) || !same(r[4], sign * r[3])) return false;
    if ((i > 0 && !zero(r[0])) || (i < m - 1 && !zero(r[5]))) return false;
  }
  return true;
}

// Where a cube of 16-float vectors is: vector (d, h, w) at p + d * sd + h * sh + w * sw floats.
struct Cube {
  const float* p;
  int64_t sd, sh, sw;
};
Cube Packed(const float* p, int side, int64_t stride) { return {p, side * side * stride, side * stride, stride}; }

// out[P^3] = (T x T x T) in[Q^3], one axis at a time with `axis` (Q -> P); out is an array of
// 16-float vectors (axes d, h, w row-major) at `out_stride` floats from one another.
template <int P, int Q, class Axis>
void Transform3d(const Axis& axis, const Cube& in, float* out, int64_t out_stride) {
  V16 t1[Q * Q * P], t2[Q * P * P];
  V16 x[Q], y[P];
  for (int d = 0; d < Q; ++d) {  // along w
    for (int h = 0; h < Q; ++h) {
      const float* row = in.p + d * in.sd + h * in.sh;
      for (int i = 0; i < Q; ++i) x[i] = Load(row + i * in.sw);
      axis(x, t1 + (d * Q + h) * P);
    }
  }
  for (int d = 0; d < Q; ++d) {  // along h
    for (int w = 0; w < P; ++w) {
      for (int i = 0; i < Q; ++i) x[i] = t1[(d * Q + i) * P + w];
      axis(x, y);
      for (int j = 0; j < P; ++j) t2[(d * P + j) * P + w] = y[j];
    }
  }
  for (int hw = 0; hw < P * P; ++hw) {  // along d
    for (int i = 0; i < Q; ++i) x[i] = t2[i * P * P + hw];
    axis(x, y);
    for (int j = 0; j < P; ++j) Store(out + (j * P * P + hw) * out_stride, y[j]);
  }
}

// A^T (a -> m) and A (m -> a) along each axis, m = 3..5 chosen at run time.
void TransformToTile(int m, const float* at, const Cube& in, float* out, int64_t os) {
  switch (m) {
    case 3: return Transform3d<3, kA>(OutputAxis<3>{at}, in, out, os);
    case 4: return Transform3d<4, kA>(OutputAxis<4>{at}, in, out, os);
    default: return Transform3d<5, kA>(OutputAxis<5>{at}, in, out, os);
  }
}
void TransformFromTile(int m, const float* at, const Cube& in, float* out, int64_t os) {
  switch (m) {
    case 3: return Transform3d<kA, 3>(GradientAxis<3>{at}, in, out, os);
    case 4: return Transform3d<kA, 4>(GradientAxis<4>{at}, in, out, os);
    default: return Transform3d<kA, 5>(GradientAxis<5>{at}, in, out, os);
  }
}

// c[r][j] (+)= sum_k a[r * ar + k * ak] * b[k * ldb + j] for r < R, j < 16 NV: one register block.
template <int R, int NV>
void Block(const float* a, int64_t ar, int64_t ak, const float* b, int64_t ldb, int kc, float* c, int64_t ldc,
           bool accumulate) {
  V16 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? Load(c + r * ldc + 16 * v) : V16{};
  }
  for (int k = 0; k < kc; ++k) {
    V16 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = Load(b + k * ldb + 16 * v);
    for (int r = 0; r < R; ++r) {
      const float s = a[r * ar + k * ak];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * bv[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) Store(c + r * ldc + 16 * v, acc[r][v]);
  }
}

template <int R>
void BlockOfVectors(int nv, const float* a, int64_t ar, int64_t ak, const float* b, int64_t ldb, int kc, float* c,
                    int64_t ldc, bool accumulate) {
  switch (nv) {
    case 1: return Block<R, 1>(a, ar, ak, b, ldb, kc, c, ldc, accumulate);
#ifdef __AVX512F__
    case 2: return Block<R, 2>(a, ar, ak, b, ldb, kc, c, ldc, accumulate);
    case 3: return Block<R, 3>(a, ar, ak, b, ldb, kc, c, ldc, accumulate);
    default: return Block<R, 4>(a, ar, ak, b, ldb, kc, c, ldc, accumulate);
#else
    default: return;
#endif
  }
}

// C (rows x cols) (+)= A B, A[r][k] at a + r * ar + k * ak, B (kc x cols, row stride ldb), C row
// stride ldc; cols a multiple of 16.
void MatMul(int rows, int cols, int kc, const float* a, int64_t ar, int64_t ak, const float* b, int64_t ldb, float* c,
            int64_t ldc, bool accumulate) {
  for (int j = 0; j < cols; j += 16 * kMaxVectors) {
    const int nv = std::min(kMaxVectors, (cols - j) / 16);
    int r = 0;
    // Whole register blocks, then the remainder (the weight gradient's rows are 16 or 32 channels)
    // in blocks of 4, 2 and 1.
    auto blocks_of = [&](auto block_rows) {
      constexpr int R = decltype(block_rows)::value;
      for (; r + R <= rows; r += R) {
        BlockOfVectors<R>(nv, a + r * ar, ar, ak, b + j, ldb, kc, c + r * ldc + j, ldc, accumulate);
      }
    };
    blocks_of(std::integral_constant<int, kRows>{});
    blocks_of(std::integral_constant<int, 4>{});
    blocks_of(std::integral_constant<int, 2>{});
    blocks_of(std::integral_constant<int, 1>{});
  }
}

// Whether channels [c0, c0 + 16) of a voxel are 16 consecutive floats in `layout`.
bool Contiguous16(const ActivationLayout& layout, int channels, int c0) {
  return layout.c_stride == 1 && layout.block % 16 == 0 && c0 + 16 <= channels;
}

// Each of channels [c0, c0 + 16)'s voxel 0 in sample n, null past the last channel; with
// `contiguous` only the first, which is all the contiguous paths read (Offset divides by the block).
template <class T>
void ChannelBases(T* x, const ActivationLayout& layout, int channels, int c0, int64_t n, bool contiguous, T* base[16]) {
  for (int c = 0; c < 16; ++c) {
    base[c] = (c == 0 || !contiguous) && c0 + c < channels ? x + layout.Offset(n, c0 + c, 0) : nullptr;
  }
}

// Element access for fp32 and bf16 tensors (uint16_t bit patterns).
inline V16 LoadElems(const float* p) { return Load(p); }
inline V16 LoadElems(const uint16_t* p) { return LoadBf16(p); }
inline void StoreElems(float* p, V16 v) { Store(p, v); }
inline void StoreElems(uint16_t* p, V16 v) { StoreBf16(p, v); }
inline float Widen(float v) { return v; }
inline float Widen(uint16_t v) { return nn_internal::Bf16ToF32(v); }
inline void Narrow(float* p, float v) { *p = v; }
inline void Narrow(uint16_t* p, float v) { *p = nn_internal::F32ToBf16(v); }

// Copies channels [c0, c0 + 16) of sample n's cube of `span`^3 voxels from (d0, h0, w0) into t
// (span^3 vectors of 16), zero outside the tensor's `side`^3 voxels and past its channels.
template <class T>
void GatherCube(const T* x, const ActivationLayout& layout, int channels, int c0, int64_t n, int side, int d0,
                int h0, int w0, int span, float* t) {
  const bool fast = Contiguous16(layout, channels, c0);
  const T* base[16];
  ChannelBases(x, layout, channels, c0, n, fast, base);
  for (int z = 0; z < span; ++z) {
    for (int y = 0; y < span; ++y) {
      for (int w = 0; w < span; ++w) {
        float* v = t + ((z * span + y) * span + w) * 16;
        const int d = d0 + z, h = h0 + y, e = w0 + w;
        if (d < 0 || h < 0 || e < 0 || d >= side || h >= side || e >= side) {
          Store(v, V16{});
          continue;
        }
        const int64_t at = ((int64_t{d} * side + h) * side + e) * layout.voxel_stride;
        if (fast) {
          Store(v, LoadElems(base[0] + at));
        } else {
          for (int c = 0; c < 16; ++c) v[c] = base[c] ? Widen(base[c][at]) : 0.f;
        }
      }
    }
  }
}

}  // namespace

struct WinogradConv3d::Buffers {
  AlignedFloats v;     // [a^3][tiles_per_block][cp]: transformed input tiles
  AlignedFloats m;     // [a^3][tiles_per_block][fp]: products, or transformed output-gradient tiles
  AlignedFloats tile;  // one gathered tile of 16 channels, a^3 x 16
  AlignedFloats out;   // one output tile of 16 filters, m^3 x 16
  AlignedFloats g;     // [a^3][cp][fp]: the weight gradient's partial sums (allocated on first use)
  std::vector<double> bias;  // [filters] partial bias gradient
};

// k = 5 (a 2^3 output tile) would work, but its weight gradient's error reaches 1e-4 of the
// output's scale; the specs use 2, 3 and 4.
int WinogradConv3d::OutputTile(int kernel) { return kernel >= 2 && kernel <= 4 ? kA - kernel + 1 : 0; }

bool WinogradConv3d::Supports(const Conv3dShape& s) {
  return OutputTile(s.kernel) > 0 &&
         int64_t{kA3} * RoundUp16(s.in_channels) * RoundUp16(s.filters) * 4 <= kMaxTransformedBytes;
}

int64_t WinogradConv3d::Tiles(const Conv3dShape& s) {
  const int m = OutputTile(s.kernel);
  if (m == 0) return 0;
  const int64_t nt = (s.out_side + m - 1) / m;
  return s.batch * nt * nt * nt;
}

double WinogradConv3d::FlopRatio(const Conv3dShape& s) {
  const int m = OutputTile(s.kernel);
  if (m == 0) return 0;
  const double cp = RoundUp16(s.in_channels), fp = RoundUp16(s.filters);
  const double in_transform = 3.0 * kA3 * kA * cp;  // multiply-adds per tile
  const double out_transform = (kA * kA * m * kA + kA * m * m * kA + double(m) * m * m * kA) * fp;
  const double product = double(kA3) * cp * fp;
  return s.DirectFlops() / (2.0 * Tiles(s) * (in_transform + out_transform + product));
}

bool WinogradConv3d::Avx512MicroKernel() { return kAvx512MicroKernel; }

WinogradConv3d::WinogradConv3d(const Conv3dShape& shape, const ActivationLayout& src, const ActivationLayout& dst,
                               Io io)
    : s_(shape), io_(io), m_(OutputTile(shape.kernel)), src_(src), dst_(dst) {
  if (m_ == 0) throw std::invalid_argument("winograd conv: kernel side " + std::to_string(s_.kernel) + " outside 2..4");
  nt_ = (s_.out_side + m_ - 1) / m_;
  cp_ = RoundUp16(s_.in_channels);
  fp_ = RoundUp16(s_.filters);
  const int k = s_.kernel;
  // Toom-Cook for the correlation y = T^T x: A^T = Eval_m^T, G = Eval_k, B^T = (Eval_a^-1)^T.
  const std::vector<double> em = Evaluation(m_), ek = Evaluation(k), ea_inv = Inverse(Evaluation(kA), kA);
  at_.resize(static_cast<size_t>(m_) * kA);
  for (int i = 0; i < m_; ++i) {
    for (int p = 0; p < kA; ++p) at_[i * kA + p] = static_cast<float>(em[p * m_ + i]);
  }
  g_.assign(ek.begin(), ek.end());
  bt_.resize(kA * kA);
  for (int i = 0; i < kA; ++i) {
    for (int j = 0; j < kA; ++j) bt_[i * kA + j] = static_cast<float>(ea_inv[j * kA + i]);
  }
  if (!CheckPairing(bt_, at_, m_)) throw std::logic_error("winograd conv: the transform matrices are not paired");
  threads_ = std::max(1, omp_get_max_threads());
  const int64_t tiles = int64_t{s_.batch} * nt_ * nt_ * nt_;
  const int64_t fit = kBlockBytes / (int64_t{kA3} * 4 * (cp_ + fp_));
  tiles_per_block_ = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({std::max<int64_t>(fit, kRows), 48, (tiles + threads_ - 1) / threads_})));
  buffers_ = std::make_unique<Buffers[]>(threads_);
  for (int i = 0; i < threads_; ++i) {
    Buffers& b = buffers_[i];
    b.v.Allocate(int64_t{kA3} * tiles_per_block_ * cp_);
    b.m.Allocate(int64_t{kA3} * tiles_per_block_ * fp_);
    b.tile.Allocate(int64_t{kA3} * 16);
    b.out.Allocate(int64_t{kA3} * 16);
    b.bias.assign(s_.filters, 0.0);
  }
  u_storage_.assign(static_cast<size_t>(kA3) * cp_ * fp_, 0.f);
  u_ = u_storage_.data();
}

WinogradConv3d::~WinogradConv3d() = default;

int64_t WinogradConv3d::WorkspaceBytes() const {
  int64_t floats = static_cast<int64_t>(u_storage_.size());
  for (int i = 0; i < threads_; ++i) {
    const Buffers& b = buffers_[i];
    floats += b.v.size() + b.m.size() + b.tile.size() + b.out.size() + b.g.size();
  }
  return floats * 4;
}

void WinogradConv3d::SetWeights(const float* w, bool flip_transpose) {
  const int C = s_.in_channels, F = s_.filters, k = s_.kernel, k3 = k * k * k;
  std::vector<double> t1(static_cast<size_t>(k) * k * kA), t2(static_cast<size_t>(k) * kA * kA);
  for (int f = 0; f < F; ++f) {
    for (int c = 0; c < C; ++c) {
      // flip_transpose: this correlation's filter f is the original's input channel f, and its
      // channel c the original's filter c; taps reversed.
      const float* src = flip_transpose ? w + (int64_t{c} * F + f) * k3 : w + (int64_t{f} * C + c) * k3;
      auto tap = [&](int d, int h, int x) {
        const int i = (d * k + h) * k + x;
        return static_cast<double>(src[flip_transpose ? k3 - 1 - i : i]);
      };
      for (int d = 0; d < k; ++d)  // G along w, then h, then d
        for (int h = 0; h < k; ++h)
          for (int p = 0; p < kA; ++p) {
            double s = 0;
            for (int x = 0; x < k; ++x) s += g_[p * k + x] * tap(d, h, x);
            t1[(d * k + h) * kA + p] = s;
          }
      for (int d = 0; d < k; ++d)
        for (int p = 0; p < kA; ++p)
          for (int q = 0; q < kA; ++q) {
            double s = 0;
            for (int h = 0; h < k; ++h) s += g_[p * k + h] * t1[(d * k + h) * kA + q];
            t2[(d * kA + p) * kA + q] = s;
          }
      for (int p = 0; p < kA; ++p)
        for (int hq = 0; hq < kA * kA; ++hq) {
          double s = 0;
          for (int d = 0; d < k; ++d) s += g_[p * k + d] * t2[d * kA * kA + hq];
          u_[(int64_t{p * kA * kA + hq} * cp_ + c) * fp_ + f] = static_cast<float>(s);
        }
    }
  }
}

WinogradConv3d::TileOrigin WinogradConv3d::Origin(int64_t tile) const {
  const int64_t per_sample = int64_t{nt_} * nt_ * nt_, r = tile % per_sample;
  return {tile / per_sample, static_cast<int>(r / (int64_t{nt_} * nt_)) * m_, static_cast<int>(r / nt_ % nt_) * m_,
          static_cast<int>(r % nt_) * m_};
}

// B^T x B^T x B^T of the input tile (a^3 voxels from the tile's origin - pad, zero outside), 16
// channels at a time, into b.v[point][slot]. fp32 tiles inside the input whose 16 channels are
// contiguous are read in place; others (and every bf16 tile, widened) are gathered first.
template <class T>
void WinogradConv3d::InputTransform(const T* src, int64_t tile, int slot, Buffers& b) const {
  const TileOrigin o = Origin(tile);
  const int side = s_.in_side, C = s_.in_channels;
  const int d0 = o.d - s_.pad_left, h0 = o.h - s_.pad_left, w0 = o.w - s_.pad_left;
  [[maybe_unused]] const bool inside =
      d0 >= 0 && h0 >= 0 && w0 >= 0 && d0 + kA <= side && h0 + kA <= side && w0 + kA <= side;
  [[maybe_unused]] const int64_t vs = src_.voxel_stride;
  const int64_t out_stride = int64_t{tiles_per_block_} * cp_;
  for (int c0 = 0; c0 < cp_; c0 += 16) {
    float* out = b.v.data() + int64_t{slot} * cp_ + c0;
    if constexpr (std::is_same_v<T, float>) {
      if (inside && Contiguous16(src_, C, c0)) {
        const float* p = src + src_.Offset(o.n, c0, (int64_t{d0} * side + h0) * side + w0);
        Transform3d<kA, kA>(InputAxis{bt_.data()}, {p, int64_t{side} * side * vs, side * vs, vs}, out, out_stride);
        continue;
      }
    }
    float* t = b.tile.data();
    GatherCube(src, src_, C, c0, o.n, side, d0, h0, w0, kA, t);
    Transform3d<kA, kA>(InputAxis{bt_.data()}, Packed(t, kA, 16), out, out_stride);
  }
}

// Gathers the output-gradient tile (m^3 voxels, zero past the output) 16 filters at a time, adds it
// to the bias sums and writes A x A x A of it into b.m[point][slot].
template <class T>
void WinogradConv3d::OutputGradientTransform(const T* diff_dst, int64_t tile, int slot, Buffers& b,
                                             double* bias_sum) const {
  const TileOrigin o = Origin(tile);
  const int side = s_.out_side, F = s_.filters;
  float* t = b.tile.data();
  for (int f0 = 0; f0 < fp_; f0 += 16) {
    GatherCube(diff_dst, dst_, F, f0, o.n, side, o.d, o.h, o.w, m_, t);
    V16 sum{};  // zero outside the output and past the filters
    for (int v = 0; v < m_ * m_ * m_; ++v) sum += Load(t + v * 16);
    for (int f = 0; f < 16 && f0 + f < F; ++f) bias_sum[f0 + f] += sum[f];
    TransformFromTile(m_, at_.data(), Packed(t, m_, 16), b.m.data() + int64_t{slot} * fp_ + f0,
                      int64_t{tiles_per_block_} * fp_);
  }
}

// A^T x A^T x A^T of b.m[point][slot], 16 filters at a time, plus bias and the leaky ReLU, into
// the tile's voxels of dst that lie inside the output.
template <class T>
void WinogradConv3d::OutputTransform(int64_t tile, int slot, const float* bias, float alpha, T* dst,
                                     Buffers& b) const {
  const TileOrigin o = Origin(tile);
  const int side = s_.out_side, F = s_.filters;
  const int dn = std::min(m_, side - o.d), hn = std::min(m_, side - o.h), wn = std::min(m_, side - o.w);
  float* t = b.out.data();
  for (int f0 = 0; f0 < fp_; f0 += 16) {
    TransformToTile(m_, at_.data(), Packed(b.m.data() + int64_t{slot} * fp_ + f0, kA, int64_t{tiles_per_block_} * fp_),
                    t, 16);
    V16 bv{};
    for (int f = 0; f < 16 && f0 + f < F; ++f) bv[f] = bias ? bias[f0 + f] : 0.f;
    const bool fast = Contiguous16(dst_, F, f0);
    T* base[16];
    ChannelBases(dst, dst_, F, f0, o.n, fast, base);
    for (int z = 0; z < dn; ++z) {
      for (int y = 0; y < hn; ++y) {
        for (int x = 0; x < wn; ++x) {
          V16 v = Load(t + ((z * m_ + y) * m_ + x) * 16) + bv;
          if (alpha >= 0.f) v = v < 0.f ? v * alpha : v;
          const int64_t at = ((int64_t{o.d + z} * side + o.h + y) * side + o.w + x) * dst_.voxel_stride;
          if (fast) {
            StoreElems(base[0] + at, v);
          } else {
            for (int f = 0; f < 16; ++f) {
              if (base[f]) Narrow(base[f] + at, v[f]);
            }
          }
        }
      }
    }
  }
}

void WinogradConv3d::Forward(const void* src, void* dst, const float* bias, float alpha) const {
  if (io_ == Io::kBf16) {
    ForwardT(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), bias, alpha);
  } else {
    ForwardT(static_cast<const float*>(src), static_cast<float*>(dst), bias, alpha);
  }
}

void WinogradConv3d::BackwardWeights(const void* src, const void* diff_dst, float* grad_w, float* grad_b) const {
  if (io_ == Io::kBf16) {
    BackwardWeightsT(static_cast<const uint16_t*>(src), static_cast<const uint16_t*>(diff_dst), grad_w, grad_b);
  } else {
    BackwardWeightsT(static_cast<const float*>(src), static_cast<const float*>(diff_dst), grad_w, grad_b);
  }
}

template <class T>
void WinogradConv3d::ForwardT(const T* src, T* dst, const float* bias, float alpha) const {
  const int tb = tiles_per_block_;
  const int64_t tiles = int64_t{s_.batch} * nt_ * nt_ * nt_, blocks = (tiles + tb - 1) / tb;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    Buffers& b = buffers_[omp_get_thread_num()];
    const int64_t first = blk * tb;
    const int count = static_cast<int>(std::min<int64_t>(tb, tiles - first));
    for (int i = 0; i < count; ++i) InputTransform(src, first + i, i, b);
    // m[p][t][f] = sum_c v[p][t][c] u[p][c][f] for every point p
    for (int p = 0; p < kA3; ++p) {
      MatMul(count, fp_, cp_, b.v.data() + int64_t{p} * tb * cp_, cp_, 1, u_ + int64_t{p} * cp_ * fp_, fp_,
             b.m.data() + int64_t{p} * tb * fp_, fp_, false);
    }
    for (int i = 0; i < count; ++i) OutputTransform(first + i, i, bias, alpha, dst, b);
  }
}

template <class T>
void WinogradConv3d::BackwardWeightsT(const T* src, const T* diff_dst, float* grad_w, float* grad_b) const {
  const int C = s_.in_channels, F = s_.filters, k = s_.kernel, tb = tiles_per_block_;
  const int64_t tiles = int64_t{s_.batch} * nt_ * nt_ * nt_, blocks = (tiles + tb - 1) / tb;
  for (int i = 0; i < threads_; ++i) {
    Buffers& b = buffers_[i];
    if (b.g.size() == 0) b.g.Allocate(int64_t{kA3} * cp_ * fp_);
    std::memset(b.g.data(), 0, static_cast<size_t>(b.g.size()) * 4);
    std::fill(b.bias.begin(), b.bias.end(), 0.0);
  }
  // Static schedule: each thread's partial sums cover the same blocks in every run.
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    Buffers& b = buffers_[omp_get_thread_num()];
    const int64_t first = blk * tb;
    const int count = static_cast<int>(std::min<int64_t>(tb, tiles - first));
    for (int i = 0; i < count; ++i) {
      InputTransform(src, first + i, i, b);
      OutputGradientTransform(diff_dst, first + i, i, b, b.bias.data());
    }
    // g[p][c][f] += sum_t v[p][t][c] m[p][t][f]
    for (int p = 0; p < kA3; ++p) {
      MatMul(cp_, fp_, count, b.v.data() + int64_t{p} * tb * cp_, 1, cp_, b.m.data() + int64_t{p} * tb * fp_, fp_,
             b.g.data() + int64_t{p} * cp_ * fp_, fp_, true);
    }
  }
  // Thread order, for reproducibility; then G^T along each axis, once per (f, c).
  Buffers& b0 = buffers_[0];
  for (int t = 1; t < threads_; ++t) {
    const float* g = buffers_[t].g.data();
    for (int64_t i = 0; i < b0.g.size(); ++i) b0.g.data()[i] += g[i];
    for (int f = 0; f < F; ++f) b0.bias[f] += buffers_[t].bias[f];
  }
  const int k3 = k * k * k;
  std::vector<double> t1(static_cast<size_t>(kA) * kA * k), t2(static_cast<size_t>(kA) * k * k);
  for (int f = 0; f < F; ++f) {
    for (int c = 0; c < C; ++c) {
      auto at = [&](int p) { return static_cast<double>(b0.g.data()[(int64_t{p} * cp_ + c) * fp_ + f]); };
      for (int pq = 0; pq < kA * kA; ++pq)  // along w
        for (int x = 0; x < k; ++x) {
          double s = 0;
          for (int r = 0; r < kA; ++r) s += g_[r * k + x] * at(pq * kA + r);
          t1[pq * k + x] = s;
        }
      for (int p = 0; p < kA; ++p)  // along h
        for (int y = 0; y < k; ++y)
          for (int x = 0; x < k; ++x) {
            double s = 0;
            for (int q = 0; q < kA; ++q) s += g_[q * k + y] * t1[(p * kA + q) * k + x];
            t2[(p * k + y) * k + x] = s;
          }
      for (int z = 0; z < k; ++z)  // along d
        for (int yx = 0; yx < k * k; ++yx) {
          double s = 0;
          for (int p = 0; p < kA; ++p) s += g_[p * k + z] * t2[p * k * k + yx];
          grad_w[(int64_t{f} * C + c) * k3 + z * k * k + yx] = static_cast<float>(s);
        }
    }
  }
  if (grad_b != nullptr) {
    for (int f = 0; f < F; ++f) grad_b[f] = static_cast<float>(b0.bias[f]);
  }
}

}  // namespace cosmoflow
