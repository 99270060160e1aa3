// A density cube: channels x depth x height x width voxels, channel-first (NCDHW without N), C order.
//
// Counts from N-body runs are int16 (what datasets store); float32 cubes come from analysis
// pipelines or after the model's input transform. Data are stored native little-endian.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

enum class DType { kInt16, kFloat32 };

const char* DTypeName(DType dtype);      // "int16", "float32"
size_t DTypeSize(DType dtype);           // 2, 4
StatusOr<DType> ParseDType(const std::string& name);

struct CubeShape {
  int channels = 0;
  int depth = 0;
  int height = 0;
  int width = 0;

  int64_t voxels() const { return int64_t{depth} * height * width; }  // per channel
  int64_t elements() const { return voxels() * channels; }
  bool operator==(const CubeShape& o) const {
    return channels == o.channels && depth == o.depth && height == o.height && width == o.width;
  }
  bool operator!=(const CubeShape& o) const { return !(*this == o); }
  std::string ToString() const;  // "4x128x128x128"
  // Checks every extent is positive and the cube is at most 2^31 elements.
  Status Validate() const;
};

class Cube {
 public:
  Cube() = default;
  // Zero-filled cube of the given shape and type.
  Cube(CubeShape shape, DType dtype);

  const CubeShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  size_t size_bytes() const { return bytes_.size(); }
  const void* raw() const { return bytes_.data(); }
  void* raw() { return bytes_.data(); }

  // Typed views; assert on the wrong type.
  int16_t* int16_data();
  const int16_t* int16_data() const;
  float* float_data();
  const float* float_data() const;

  // Copies every element as float into dst[elements()].
  void ToFloat(float* dst) const;
  // Fails (naming the first bad voxel) on NaN/Inf floats or negative values.
  Status CheckFiniteNonNegative() const;

 private:
  CubeShape shape_;
  DType dtype_ = DType::kInt16;
  std::vector<uint8_t> bytes_;
};

// How the axes of a 4-D array are ordered on disk: channel-first (C,D,H,W) or channel-last (D,H,W,C).
enum class AxisLayout { kChannelFirst, kChannelLast };

// Transposes a channel-last int16/float array of (D,H,W,C) into a channel-first Cube.
Cube ChannelLastToFirst(const void* src, CubeShape shape, DType dtype);

}  // namespace cosmoflow
