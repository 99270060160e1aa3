// What the fp32 tiled convolution kernels (FFT-tiled, Winograd) share: where an activation's
// values are (ActivationLayout) and the problem they solve (Conv3dShape).
#pragma once

#include <cstdint>

namespace cosmoflow {

// Strides of a 5-D activation (n, c, d, h, w) whose channels are split in blocks of `block`:
// offset = n * n_stride + (c / block) * block_stride + (c % block) * c_stride + voxel * voxel_stride.
struct ActivationLayout {
  int64_t block = 1;
  int64_t n_stride = 0, block_stride = 0, c_stride = 0, voxel_stride = 0;
  int64_t Offset(int64_t n, int64_t c, int64_t voxel) const {
    return n * n_stride + (c / block) * block_stride + (c % block) * c_stride + voxel * voxel_stride;
  }
  static ActivationLayout Planar(int64_t channels, int64_t voxels) {  // NCDHW
    return {channels, channels * voxels, 0, voxels, 1};
  }
  static ActivationLayout ChannelsLast(int64_t channels, int64_t voxels) {  // NDHWC
    return {channels, channels * voxels, 0, 1, channels};
  }
  static ActivationLayout Blocked(int64_t channels, int64_t voxels, int64_t block) {  // nCdhw<b>c
    const int64_t blocks = (channels + block - 1) / block;
    return {block, blocks * voxels * block, voxels * block, 1, block};
  }
};

// A stride-1 correlation y[n][f][o] = sum_c sum_i x[n][c][o + i - pad_left] w[f][c][i] over cubes
// (o, i 3-D; x zero outside the input).
struct Conv3dShape {
  int batch = 1;
  int in_channels = 1;
  int filters = 1;
  int in_side = 1;
  int out_side = 1;
  int kernel = 1;
  int pad_left = 0;  // input voxel of output 0, tap 0 is -pad_left
  double DirectFlops() const {  // 2 k^3 C F O^3 per batch, as the network counts
    const double o = out_side;
    return 2.0 * kernel * kernel * kernel * in_channels * filters * o * o * o * batch;
  }
};

}  // namespace cosmoflow
