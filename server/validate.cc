#include "server/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

namespace cosmoflow {
namespace {

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string s = "[";
  for (int i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "(c, d, h, w)" of flat element `i` in the given layout, for messages that point at a voxel.
std::string VoxelName(const CubeShape& s, AxisLayout layout, int64_t i) {
  int64_t c, d, h, w;
  if (layout == AxisLayout::kChannelFirst) {
    w = i % s.width;
    i /= s.width;
    h = i % s.height;
    i /= s.height;
    d = i % s.depth;
    c = i / s.depth;
  } else {
    c = i % s.channels;
    i /= s.channels;
    w = i % s.width;
    i /= s.width;
    h = i % s.height;
    d = i / s.height;
  }
  return "(c=" + std::to_string(c) + ", d=" + std::to_string(d) + ", h=" + std::to_string(h) +
         ", w=" + std::to_string(w) + ")";
}

StatusOr<DType> CheckDType(const v1::Cube& cube, const std::string& field) {
  switch (cube.dtype()) {
    case v1::DTYPE_INT16:
      return DType::kInt16;
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_UNSPECIFIED:
      return InvalidArgumentError(field +
                                  ".dtype is unspecified (expected DTYPE_INT16 or DTYPE_FLOAT32)");
    default:
      return InvalidArgumentError(field + ".dtype has unknown value " +
                                  std::to_string(cube.dtype()) +
                                  " (expected DTYPE_INT16 or DTYPE_FLOAT32)");
  }
}

StatusOr<AxisLayout> CheckLayout(const v1::Cube& cube, const std::string& field) {
  switch (cube.layout()) {
    case v1::LAYOUT_UNSPECIFIED:
    case v1::LAYOUT_CHANNEL_FIRST:
      return AxisLayout::kChannelFirst;
    case v1::LAYOUT_CHANNEL_LAST:
      return AxisLayout::kChannelLast;
    default:
      return InvalidArgumentError(field + ".layout has unknown value " +
                                  std::to_string(cube.layout()) +
                                  " (expected LAYOUT_CHANNEL_FIRST or LAYOUT_CHANNEL_LAST)");
  }
}

// The cube's shape, channel-first, which must be the model's.
StatusOr<CubeShape> CheckShape(const v1::Cube& cube, AxisLayout layout,
                               const ExpectedInput& expected, const std::string& field) {
  const auto& shape = cube.shape();
  if (shape.size() != 3 && shape.size() != 4)
    return InvalidArgumentError(field + ".shape " + ShapeString(shape) + " has " +
                                std::to_string(shape.size()) +
                                " extents (expected [C, D, H, W], [D, H, W, C] or [D, H, W])");
  for (int i = 0; i < shape.size(); ++i)
    if (shape[i] <= 0 || shape[i] > (int64_t{1} << 20))
      return InvalidArgumentError(field + ".shape " + ShapeString(shape) + " has extent " +
                                  std::to_string(shape[i]) + " at axis " + std::to_string(i) +
                                  " (every extent must be in [1, 2^20])");
  CubeShape s;
  if (shape.size() == 3) {
    s = {1, int(shape[0]), int(shape[1]), int(shape[2])};
  } else if (layout == AxisLayout::kChannelFirst) {
    s = {int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3])};
  } else {
    s = {int(shape[3]), int(shape[0]), int(shape[1]), int(shape[2])};
  }
  const CubeShape want{expected.channels, expected.side, expected.side, expected.side};
  if (s != want)
    return InvalidArgumentError(field + ".shape " + ShapeString(shape) + " is " + s.ToString() +
                                " channel-first, but the model takes " + want.ToString());
  return s;
}

// Values: counts are never negative and floats must be finite. memcpy because protobuf gives no
// alignment guarantee for bytes fields. Blocks are first checked by a branch-free loop that the
// compiler vectorises (an early exit per voxel does not vectorise, and this runs on the gRPC
// threads that share the cores with the forward pass); only a block holding a bad value is
// searched voxel by voxel, for the message.
constexpr int64_t kBlock = 4096;

Status CheckCounts(const CubeView& view, const std::string& field) {
  const int64_t n = view.shape.elements();
  const char* p = static_cast<const char*>(view.data);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    int16_t any = 0;  // sign bit set iff some value is negative
    for (int64_t i = b; i < e; ++i) {
      int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      any |= v;
    }
    if (any >= 0) continue;
    for (int64_t i = b; i < e; ++i) {
      int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      if (v < 0)
        return InvalidArgumentError(field + ".data has negative count " + std::to_string(v) +
                                    " at voxel " + VoxelName(view.shape, view.layout, i));
    }
  }
  return Status::Ok();
}

Status CheckFloats(const CubeView& view, const std::string& field) {
  const int64_t n = view.shape.elements();
  const char* p = static_cast<const char*>(view.data);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    // As bits, finite non-negative floats are 0 .. 0x7F7FFFFF (FLT_MAX), plus -0.0 (0x80000000),
    // which compares >= 0 and is accepted. Everything else is negative, infinite or NaN.
    bool any = false;
    for (int64_t i = b; i < e; ++i) {
      uint32_t u;
      std::memcpy(&u, p + 4 * i, 4);
      any |= (u > 0x7F7FFFFFu) & (u != 0x80000000u);
    }
    if (!any) continue;
    for (int64_t i = b; i < e; ++i) {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      if (!(v >= 0.f && v <= std::numeric_limits<float>::max())) {  // catches NaN, Inf, < 0
        char value[32];  // %.9g: every float exactly, and -1e-45 not as "-0.000000"
        std::snprintf(value, sizeof value, "%.9g", double(v));
        std::string what = std::isnan(v)   ? "NaN"
                           : std::isinf(v) ? "infinite value"
                                           : "negative value " + std::string(value);
        return InvalidArgumentError(field + ".data has " + what + " at voxel " +
                                    VoxelName(view.shape, view.layout, i));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<CubeView> ValidateCube(const v1::Cube& cube, const ExpectedInput& expected,
                                const std::string& field) {
  CubeView view;
  if (cube.shape().empty() && cube.data().empty() && cube.dtype() == v1::DTYPE_UNSPECIFIED)
    return InvalidArgumentError(field + " is empty (no shape, dtype or data)");
  CF_ASSIGN_OR_RETURN(view.dtype, CheckDType(cube, field));
  CF_ASSIGN_OR_RETURN(view.layout, CheckLayout(cube, field));
  CF_ASSIGN_OR_RETURN(view.shape, CheckShape(cube, view.layout, expected, field));
  const size_t want_bytes = size_t(view.shape.elements()) * DTypeSize(view.dtype);
  if (cube.data().size() != want_bytes)
    return InvalidArgumentError(field + ".data has " + std::to_string(cube.data().size()) +
                                " bytes, but shape " + ShapeString(cube.shape()) + " of " +
                                DTypeName(view.dtype) + " needs " + std::to_string(want_bytes));
  view.data = cube.data().data();
  CF_RETURN_IF_ERROR(view.dtype == DType::kInt16 ? CheckCounts(view, field)
                                                 : CheckFloats(view, field));
  return view;
}

void CubeToNetworkInput(const CubeView& cube, InputTransform transform, float* dst) {
  const int64_t n = cube.shape.elements();
  const int64_t voxels = cube.shape.voxels();
  const void* src = cube.data;
  Cube transposed;
  if (cube.layout == AxisLayout::kChannelLast && cube.shape.channels > 1) {
    transposed = ChannelLastToFirst(cube.data, cube.shape, cube.dtype);
    src = transposed.raw();
  }
  // The request bytes may be unaligned: copy into an aligned buffer unless already transposed or
  // aligned (ApplyInputTransform's log1p of int16 counts is a table lookup).
  if (cube.dtype == DType::kInt16) {
    std::vector<int16_t> aligned;
    const int16_t* counts;
    if (src == cube.data && reinterpret_cast<uintptr_t>(src) % alignof(int16_t) != 0) {
      aligned.resize(n);
      std::memcpy(aligned.data(), src, n * 2);
      counts = aligned.data();
    } else {
      counts = static_cast<const int16_t*>(src);
    }
    ApplyInputTransform(transform, counts, n, voxels, dst);
  } else {
    // Copied first: the request bytes may be unaligned, and the transform may not work in place.
    std::vector<float> values(n);
    std::memcpy(values.data(), src, n * 4);
    ApplyInputTransform(transform, values.data(), n, voxels, dst);
  }
}

}  // namespace cosmoflow
