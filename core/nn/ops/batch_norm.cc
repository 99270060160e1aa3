// batch_norm: per-channel normalisation of a 5-D (N, C, D, H, W) or 2-D (N, C) activation.
//
// Training: y = gamma * (x - mean) / sqrt(var + eps) + beta with the batch's mean and (biased)
// variance, over every replica of the network when OpContext::allreduce_sum is set (so R ranks x
// batch b compute what one process computes on batch R x b); the running statistics move by
// `momentum` towards the batch's mean and unbiased variance. Inference uses the running statistics.
// Backward: dx = gamma / sqrt(var + eps) * (dy - mean(dy) - xhat * mean(dy * xhat)), the means over
// the whole (global) batch; dgamma = sum(dy * xhat) and dbeta = sum(dy) over this replica's batch
// (the trainer averages gradients across ranks, which completes them).
//
// Our own loops rather than oneDNN's batch normalization, whose reductions cannot span ranks. The
// op works on a plain fp32 copy of src (a reorder when the previous op chose another layout or
// bf16) and writes a plain dst in the network's type. Sums are in double, channel by channel in a
// fixed order: results do not depend on the thread count.
#include <cmath>

#include "core/nn/network_internal.h"
#include "core/nn/ops/onednn_util.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

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
    const bool bf16 = c.dt == Dt::bf16;
    // sums_[ch] = sum dy, sums_[C + ch] = sum dy * xhat over this replica.
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      double s = 0, sx = 0;
      for (int64_t b = 0; b < n_; ++b) {
        const int64_t base = (b * channels_ + ch) * spatial_;
        for (int64_t i = 0; i < spatial_; ++i) {
          const double dy = DiffDst(bf16, base + i);
          s += dy;
          sx += dy * (x[base + i] - mean_[ch]) * invstd_[ch];
        }
      }
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
      const double k = gamma_->value[ch] * invstd_[ch];
      const double mean_dy = sums_[ch] / count, mean_dy_xhat = sums_[channels_ + ch] / count;
      for (int64_t b = 0; b < n_; ++b) {
        const int64_t base = (b * channels_ + ch) * spatial_;
        for (int64_t i = 0; i < spatial_; ++i) {
          const double xhat = (x[base + i] - mean_[ch]) * invstd_[ch];
          dx[base + i] = static_cast<float>(k * (DiffDst(bf16, base + i) - mean_dy - xhat * mean_dy_xhat));
        }
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
  double DiffDst(bool bf16, int64_t i) const {
    return bf16 ? Bf16ToF32(static_cast<const uint16_t*>(diff_dst.get_data_handle())[i])
                : static_cast<const float*>(diff_dst.get_data_handle())[i];
  }

  // Mean and variance of the (global) batch; updates the running statistics.
  void BatchStatistics(OpContext& c) {
    const float* x = X();
    std::vector<double>& sums = stat_sums_;
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      double s = 0, s2 = 0;
      for (int64_t b = 0; b < n_; ++b) {
        const float* row = x + (b * channels_ + ch) * spatial_;
        for (int64_t i = 0; i < spatial_; ++i) {
          s += row[i];
          s2 += double(row[i]) * row[i];
        }
      }
      sums[ch] = s;
      sums[channels_ + ch] = s2;
    }
    sums[2 * channels_] = static_cast<double>(n_ * spatial_);
    if (c.allreduce_sum) c.allreduce_sum(sums.data(), static_cast<int>(sums.size()));
    global_count_ = sums[2 * channels_];
    for (int64_t ch = 0; ch < channels_; ++ch) {
      const double mean = sums[ch] / global_count_;
      const double var = std::max(0.0, sums[channels_ + ch] / global_count_ - mean * mean);
      mean_[ch] = mean;
      invstd_[ch] = 1.0 / std::sqrt(var + epsilon_);
      const double unbiased = global_count_ > 1 ? var * global_count_ / (global_count_ - 1) : var;
      running_mean_->value[ch] = static_cast<float>((1 - momentum_) * running_mean_->value[ch] + momentum_ * mean);
      running_var_->value[ch] = static_cast<float>((1 - momentum_) * running_var_->value[ch] + momentum_ * unbiased);
    }
  }

  void Normalise(bool bf16) {
    const float* x = X();
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < channels_; ++ch) {
      const double k = gamma_->value[ch] * invstd_[ch], shift = beta_->value[ch] - k * mean_[ch];
      for (int64_t b = 0; b < n_; ++b) {
        const int64_t base = (b * channels_ + ch) * spatial_;
        for (int64_t i = 0; i < spatial_; ++i) {
          const float y = static_cast<float>(k * x[base + i] + shift);
          if (bf16) {
            static_cast<uint16_t*>(dst.get_data_handle())[base + i] = F32ToBf16(y);
          } else {
            static_cast<float*>(dst.get_data_handle())[base + i] = y;
          }
        }
      }
    }
  }

  float momentum_, epsilon_;
  ParamStore *gamma_ = nullptr, *beta_ = nullptr, *running_mean_ = nullptr, *running_var_ = nullptr;
  int64_t n_ = 0, channels_ = 0, spatial_ = 0;
  memory x_, dx_;
  dnnl::reorder to_x_, from_dx_;
  bool reorder_src_ = false;
  std::vector<double> mean_, invstd_, sums_, stat_sums_;
  double global_count_ = 1;
};

}  // namespace

std::unique_ptr<Op> MakeBatchNormOp(OpArgs& args) { return std::make_unique<BatchNormOp>(args); }

}  // namespace cosmoflow::nn_internal
