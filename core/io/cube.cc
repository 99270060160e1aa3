#include "core/io/cube.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace cosmoflow {

const char* DTypeName(DType dtype) { return dtype == DType::kInt16 ? "int16" : "float32"; }
size_t DTypeSize(DType dtype) { return dtype == DType::kInt16 ? 2 : 4; }

StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "int16") return DType::kInt16;
  if (name == "float32") return DType::kFloat32;
  return InvalidArgumentError("unsupported dtype '" + name + "' (expected int16 or float32)");
}

std::string CubeShape::ToString() const {
  return std::to_string(channels) + "x" + std::to_string(depth) + "x" + std::to_string(height) +
         "x" + std::to_string(width);
}

Status CubeShape::Validate() const {
  if (channels <= 0 || depth <= 0 || height <= 0 || width <= 0)
    return InvalidArgumentError("cube shape " + ToString() + " has a non-positive extent");
  // Each extent is an int; check the product without overflow.
  double n = double(channels) * depth * height * width;
  if (n > double(std::numeric_limits<int32_t>::max()))
    return InvalidArgumentError("cube shape " + ToString() + " has more than 2^31 elements");
  return Status::Ok();
}

Cube::Cube(CubeShape shape, DType dtype)
    : shape_(shape), dtype_(dtype), bytes_(static_cast<size_t>(shape.elements()) * DTypeSize(dtype)) {}

int16_t* Cube::int16_data() {
  assert(dtype_ == DType::kInt16);
  return reinterpret_cast<int16_t*>(bytes_.data());
}
const int16_t* Cube::int16_data() const {
  assert(dtype_ == DType::kInt16);
  return reinterpret_cast<const int16_t*>(bytes_.data());
}
float* Cube::float_data() {
  assert(dtype_ == DType::kFloat32);
  return reinterpret_cast<float*>(bytes_.data());
}
const float* Cube::float_data() const {
  assert(dtype_ == DType::kFloat32);
  return reinterpret_cast<const float*>(bytes_.data());
}

void Cube::ToFloat(float* dst) const {
  const int64_t n = shape_.elements();
  if (dtype_ == DType::kFloat32) {
    std::memcpy(dst, bytes_.data(), n * sizeof(float));
    return;
  }
  const int16_t* src = int16_data();
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

Status Cube::CheckFiniteNonNegative() const {
  const int64_t n = shape_.elements();
  if (dtype_ == DType::kInt16) {
    const int16_t* p = int16_data();
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < 0)
        return InvalidArgumentError("negative count " + std::to_string(p[i]) + " at element " +
                                    std::to_string(i));
    return Status::Ok();
  }
  const float* p = float_data();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i]))
      return InvalidArgumentError(std::string(std::isnan(p[i]) ? "NaN" : "infinite value") +
                                  " at element " + std::to_string(i));
    if (p[i] < 0)
      return InvalidArgumentError("negative value " + std::to_string(p[i]) + " at element " +
                                  std::to_string(i));
  }
  return Status::Ok();
}

Cube ChannelLastToFirst(const void* src, CubeShape shape, DType dtype) {
  Cube cube(shape, dtype);
  const int64_t voxels = shape.voxels();
  const int c = shape.channels;
  const size_t es = DTypeSize(dtype);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(cube.raw());
  // memcpy loads: `src` may sit at any address (e.g. inside a protobuf record), so no typed reads.
  for (int64_t v = 0; v < voxels; ++v)
    for (int ch = 0; ch < c; ++ch) std::memcpy(d + (ch * voxels + v) * es, s + (v * c + ch) * es, es);
  return cube;
}

}  // namespace cosmoflow
