// batch_norm: per-channel normalisation of a 5-D (N, C, D, H, W) or 2-D (N, C) activation.
//
// Training: y = gamma * (x - mean) / sqrt(var + eps) + beta with the batch's mean and (biased)
// variance, over every replica of the network when OpContext::allreduce_sum is set (so R ranks x
// batch b compute what one process computes on batch R x b); the running statistics move by
// `momentum` towards the batch's mean and unbiased variance, or, in a statistics pass
// (Network::BeginStatisticsPass), become the mean and unbiased variance of all the pass's batches
// together. Inference uses the running statistics.
// Backward: dx = gamma / sqrt(var + eps) * (dy - mean(dy) - xhat * mean(dy * xhat)), the means over
// the whole (global) batch; dgamma = sum(dy * xhat) and dbeta = sum(dy) over this replica's batch
// (the trainer averages gradients across ranks, which completes them).
//
// Our own loops rather than oneDNN's batch normalization, whose reductions cannot span ranks. The
// op works on a plain fp32 copy of src (a reorder when the previous op chose another layout or
// bf16) and writes a plain dst in the network's type. Rows are vectorised (the row kernels below);
// sums end in double, channel by channel in a fixed order: results do not depend on the thread
// count.
#include <algorithm>
#include <cmath>

#include "core/nn/kernels/vec16.h"
#include "core/nn/network_internal.h"
#include "core/nn/ops/onednn_util.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

// Row kernels over one (sample, channel) row of `n` contiguous values: 16 lanes at a time
// (vec16.h), sums in fp32 within blocks of kBlock values and in double across blocks, so their
// rounding error does not grow with the row; the tail (n not a multiple of 16) element by element.
// The order is fixed: results do not depend on the thread count. `base` is the row's first element
// in the activation that `p` (fp32 or bf16) points to.
constexpr int64_t kBlock = 1024;

double LaneSum(V16 v) {
  double s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}
V16 Load16(const void* p, bool bf16, int64_t i) {
  return bf16 ? LoadBf16(static_cast<const unsigned short*>(p) + i) : Load(static_cast<const float*>(p) + i);
}
float Load1(const void* p, bool bf16, int64_t i) {
  return bf16 ? Bf16ToF32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}
void Store16(void* p, bool bf16, int64_t i, V16 v) {
  if (bf16) {
    StoreBf16(static_cast<unsigned short*>(p) + i, v);
  } else {
    Store(static_cast<float*>(p) + i, v);
  }
}
void Store1(void* p, bool bf16, int64_t i, float v) {
  if (bf16) {
    static_cast<uint16_t*>(p)[i] = F32ToBf16(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// s += sum x.
void RowSum(const float* x, int64_t n, double* s) {
  const int64_t vec_end = n - n % 16;
  int64_t i = 0;
  while (i < vec_end) {
    const int64_t end = std::min(vec_end, i + kBlock);
    V16 a = {};
    for (; i < end; i += 16) a += Load(x + i);
    *s += LaneSum(a);
  }
  for (; i < n; ++i) *s += x[i];
}

// s += sum (x - pivot), s2 += sum (x - pivot)^2.
void RowSums(const float* x, int64_t n, float pivot, double* s, double* s2) {
  const int64_t vec_end = n - n % 16;
  int64_t i = 0;
  while (i < vec_end) {
    const int64_t end = std::min(vec_end, i + kBlock);
    V16 a = {}, a2 = {};
    for (; i < end; i += 16) {
      const V16 v = Load(x + i) - pivot;
      a += v;
      a2 += v * v;
    }
    *s += LaneSum(a);
    *s2 += LaneSum(a2);
  }
  for (; i < n; ++i) {
    const double v = double(x[i]) - pivot;
    *s += v;
    *s2 += v * v;
  }
}

// s += sum dy, sdx += sum dy (x - mean).
void RowGradSums(const float* x, const void* dy, bool bf16, int64_t base, int64_t n, float mean, double* s,
                 double* sdx) {
  const int64_t vec_end = n - n % 16;
  int64_t i = 0;
  while (i < vec_end) {
    const int64_t end = std::min(vec_end, i + kBlock);
    V16 a = {}, ax = {};
    for (; i < end; i += 16) {
      const V16 g = Load16(dy, bf16, base + i);
      a += g;
      ax += g * (Load(x + i) - mean);
    }
    *s += LaneSum(a);
    *sdx += LaneSum(ax);
  }
  for (; i < n; ++i) {
    const double g = Load1(dy, bf16, base + i);
    *s += g;
    *sdx += g * (double(x[i]) - mean);
  }
}

// y = k x + shift, written as fp32 or bf16 at y[base..].
void RowAffine(const float* x, int64_t n, float k, float shift, void* y, bool bf16, int64_t base) {
  const int64_t vec_end = n - n % 16;
  int64_t i = 0;
  for (; i < vec_end; i += 16) Store16(y, bf16, base + i, k * Load(x + i) + shift);
  for (; i < n; ++i) Store1(y, bf16, base + i, k * x[i] + shift);
}

// dx = a dy + b x + c (fp32 dx).
struct Affine2 {
  float a, b, c;
};
void RowInputGradient(const float* x, const void* dy, bool bf16, int64_t base, int64_t n, Affine2 f, float* dx) {
  const int64_t vec_end = n - n % 16;
  int64_t i = 0;
  for (; i < vec_end; i += 16) Store(dx + i, f.a * Load16(dy, bf16, base + i) + f.b * Load(x + i) + f.c);
  for (; i < n; ++i) dx[i] = f.a * Load1(dy, bf16, base + i) + f.b * x[i] + f.c;
}

class BatchNormOp : public Op {
 public:
  explicit BatchNormOp(OpArgs& a)
      : Op(a.name), momentum_(a.layer().momentum), epsilon_(a.layer().epsilon) {
    OpContext& c = a.ctx;
    gamma_ = a.params[0];
    beta_ = a.params[1];
    running_mean_ = a.params[2];
    running_var_ = a.params[3];
    params = {a.param_indices[0], a.param_indices[1]};
    src_md = a.src_md;
    src = a.src;
    const memory::dims d = src_md.dims();
    n_ = d[0];
    channels_ = d[1];
    spatial_ = 1;
    for (size_t i = 2; i < d.size(); ++i) spatial_ *= d[i];
    const memory::desc plain_f32(d, Dt::f32, PlainTag(d.size()));
    x_ = memory(plain_f32, c.eng);
    if (src_md != plain_f32) to_x_ = dnnl::reorder(src, x_);
    reorder_src_ = src_md != plain_f32;
    dst_md = memory::desc(d, c.dt, PlainTag(d.size()));
    dst = memory(dst_md, c.eng);
    mean_.assign(channels_, 0.0);
    stat_sums_.assign(2 * channels_ + 1, 0.0);
    invstd_.assign(channels_, 0.0);
    pivot_.assign(channels_, 0.0);
    if (c.training) {
      dx_ = memory(plain_f32, c.eng);
      sums_.assign(2 * channels_, 0.0);
    }
  }

  void SetUpBackward(OpContext& c, bool need_diff_src) override {
    if (need_diff_src && reorder_src_) from_dx_ = dnnl::reorder(dx_, diff_src);
  }

  void Forward(OpContext& c) override {
    if (reorder_src_) to_x_.execute(c.strm, src, x_);
    c.strm.wait();
    if (c.training) {
      BatchStatistics(c);
    } else {
      for (int64_t ch = 0; ch < channels_; ++ch) {
        mean_[ch] = running_mean_->value[ch];
        invstd_[ch] = 1.0 / std::sqrt(double(running_var_->value[ch]) + epsilon_);
      }
    }
    Normalise(c.dt == Dt::bf16);
  }

  void Backward(OpContext& c, bool need_diff_src) override {
    c.strm.wait();
    const float* x = X();
    const void* dy = diff_dst.get_data_handle();
    const bool bf16 = c.dt == Dt::bf16;
    // sums_[ch] = sum dy, sums_[C + ch] = sum dy * xhat over this replica.
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      double s = 0, sx = 0;
      for (int64_t b = 0; b < n_; ++b) {
        const int64_t base = (b * channels_ + ch) * spatial_;
        RowGradSums(x + base, dy, bf16, base, spatial_, static_cast<float>(mean_[ch]), &s, &sx);
      }
      sx *= invstd_[ch];
      sums_[ch] = s;
      sums_[channels_ + ch] = sx;
      gamma_->grad[ch] = static_cast<float>(sx);
      beta_->grad[ch] = static_cast<float>(s);
    }
    if (!need_diff_src) return;
    if (c.allreduce_sum) c.allreduce_sum(sums_.data(), static_cast<int>(sums_.size()));
    float* dx = reorder_src_ ? static_cast<float*>(dx_.get_data_handle())
                             : static_cast<float*>(diff_src.get_data_handle());
    const double count = global_count_;
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      // dx = k (dy - mean(dy) - xhat mean(dy xhat)) = a dy + b x + c, with xhat = (x - mean) invstd.
      const double k = gamma_->value[ch] * invstd_[ch];
      const double mean_dy = sums_[ch] / count, mean_dy_xhat = sums_[channels_ + ch] / count;
      const double b_x = -k * invstd_[ch] * mean_dy_xhat;
      const Affine2 f{static_cast<float>(k), static_cast<float>(b_x),
                      static_cast<float>(-k * mean_dy - b_x * mean_[ch])};
      for (int64_t b = 0; b < n_; ++b) {
        const int64_t base = (b * channels_ + ch) * spatial_;
        RowInputGradient(x + base, dy, bf16, base, spatial_, f, dx + base);
      }
    }
    if (reorder_src_) from_dx_.execute(c.strm, dx_, diff_src);
  }

  std::vector<KernelChoice> Kernels() const override {
    return {{name_, "fwd", "cosmoflow", reorder_src_ ? "batch_norm (src reordered to plain fp32)" : "batch_norm"}};
  }
  int64_t WorkspaceBytes() const override {
    return static_cast<int64_t>(x_.get_desc().get_size()) + (dx_ ? static_cast<int64_t>(dx_.get_desc().get_size()) : 0);
  }

 private:
  const float* X() const { return static_cast<const float*>(reorder_src_ ? x_.get_data_handle() : src.get_data_handle()); }
  // Mean and variance of the (global) batch; updates the running statistics.
  void BatchStatistics(OpContext& c) {
    const float* x = X();
    std::vector<double>& sums = stat_sums_;
    // Two passes, each summed over the replicas: the mean, then the squared deviations from it,
    // which do not cancel however large the mean is against the spread.
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      double s = 0;
      for (int64_t b = 0; b < n_; ++b) RowSum(x + (b * channels_ + ch) * spatial_, spatial_, &s);
      sums[ch] = s;
    }
    sums[channels_] = static_cast<double>(n_ * spatial_);
    if (c.allreduce_sum) c.allreduce_sum(sums.data(), static_cast<int>(channels_ + 1));
    global_count_ = sums[channels_];
    for (int64_t ch = 0; ch < channels_; ++ch) mean_[ch] = sums[ch] / global_count_;
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      double s = 0, s2 = 0;
      for (int64_t b = 0; b < n_; ++b) {
        RowSums(x + (b * channels_ + ch) * spatial_, spatial_, static_cast<float>(mean_[ch]), &s, &s2);
      }
      sums[ch] = s;
      sums[channels_ + ch] = s2;
    }
    if (c.allreduce_sum) c.allreduce_sum(sums.data(), static_cast<int>(2 * channels_));
    if (c.statistics_pass == 1) pass_sums_.assign(3 * channels_, 0.0);
    for (int64_t ch = 0; ch < channels_; ++ch) {
      // sums[ch] is what rounding left of sum (x - mean); it corrects the mean's own rounding.
      const double residual = sums[ch] / global_count_;
      const double var = std::max(0.0, sums[channels_ + ch] / global_count_ - residual * residual);
      mean_[ch] += residual;
      invstd_[ch] = 1.0 / std::sqrt(var + epsilon_);
      if (c.statistics_pass > 0) {
        Accumulate(c.statistics_pass, ch, var);
        continue;
      }
      const double unbiased = global_count_ > 1 ? var * global_count_ / (global_count_ - 1) : var;
      running_mean_->value[ch] = static_cast<float>((1 - momentum_) * running_mean_->value[ch] + momentum_ * mean_[ch]);
      running_var_->value[ch] = static_cast<float>((1 - momentum_) * running_var_->value[ch] + momentum_ * unbiased);
    }
  }

  // The k-th batch of a statistics pass, channel ch, with biased variance `var`: sums of count,
  // count x (mean - pivot) and count x (var + (mean - pivot)^2) over the pass, the pivot being the
  // first batch's mean (so a mean large against the spread does not cancel), and the running
  // statistics set to the union's mean and unbiased variance.
  void Accumulate(int64_t k, int64_t ch, double var) {
    if (k == 1) pivot_[ch] = mean_[ch];
    double* acc = pass_sums_.data() + 3 * ch;
    const double d = mean_[ch] - pivot_[ch], n = global_count_;
    acc[0] += n;
    acc[1] += n * d;
    acc[2] += n * (var + d * d);
    const double shift = acc[1] / acc[0];
    const double pop_var = std::max(0.0, acc[2] / acc[0] - shift * shift);
    running_mean_->value[ch] = static_cast<float>(pivot_[ch] + shift);
    running_var_->value[ch] = static_cast<float>(acc[0] > 1 ? pop_var * acc[0] / (acc[0] - 1) : pop_var);
  }

  void Normalise(bool bf16) {
    const float* x = X();
    void* y = dst.get_data_handle();
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      const double k = gamma_->value[ch] * invstd_[ch], shift = beta_->value[ch] - k * mean_[ch];
      for (int64_t b = 0; b < n_; ++b) {
        const int64_t base = (b * channels_ + ch) * spatial_;
        RowAffine(x + base, spatial_, static_cast<float>(k), static_cast<float>(shift), y, bf16, base);
      }
    }
  }

  float momentum_, epsilon_;
  ParamStore *gamma_ = nullptr, *beta_ = nullptr, *running_mean_ = nullptr, *running_var_ = nullptr;
  int64_t n_ = 0, channels_ = 0, spatial_ = 0;
  memory x_, dx_;
  dnnl::reorder to_x_, from_dx_;
  bool reorder_src_ = false;
  std::vector<double> mean_, invstd_, sums_, stat_sums_;  // stat_sums_: 2 C + 1
  std::vector<double> pivot_, pass_sums_;                 // a statistics pass: C and 3 C
  double global_count_ = 1;
};

}  // namespace

std::unique_ptr<Op> MakeBatchNormOp(OpArgs& args) { return std::make_unique<BatchNormOp>(args); }

}  // namespace cosmoflow::nn_internal
