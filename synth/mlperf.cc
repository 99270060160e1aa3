#include "synth/mlperf.h"

#include <cmath>
#include <cstring>

#include "synth/tfrecord.h"

namespace cosmoflow {
namespace synth {

StatusOr<MlperfSample> DecodeMlperfExample(std::string_view record, int side) {
  CF_ASSIGN_OR_RETURN(auto features, ParseExample(record));
  auto x = features.find("x");
  if (x == features.end()) return DataLossError("feature 'x' (the cube) is missing");
  auto y = features.find("y");
  if (y == features.end()) return DataLossError("feature 'y' (the labels) is missing");
  if (x->second.kind != ExampleFeature::Kind::kBytes || x->second.bytes.size() != 1) {
    return DataLossError(std::string("feature 'x' must be a bytes_list with one value, found a ") +
                         FeatureKindName(x->second.kind) + " with " +
                         std::to_string(x->second.kind == ExampleFeature::Kind::kBytes
                                            ? x->second.bytes.size()
                                            : x->second.floats.size() + x->second.ints.size()) +
                         " values");
  }
  if (y->second.kind != ExampleFeature::Kind::kFloat || y->second.floats.size() != kMlperfParams) {
    return DataLossError(
        std::string("feature 'y' must be a float_list of 4 unitPar values, found a ") +
        FeatureKindName(y->second.kind) + " with " +
        std::to_string(y->second.floats.size() + y->second.ints.size() + y->second.bytes.size()) +
        " values");
  }
  const CubeShape shape{kMlperfChannels, side, side, side};
  const std::string_view bytes = x->second.bytes[0];
  const size_t expected = static_cast<size_t>(shape.elements()) * sizeof(int16_t);
  if (bytes.size() != expected) {
    return DataLossError("feature 'x' has " + std::to_string(bytes.size()) + " bytes, expected " +
                         std::to_string(expected) + " (" + std::to_string(side) + "^3 x " +
                         std::to_string(kMlperfChannels) + " int16)");
  }
  MlperfSample sample;
  // Transposed here rather than with core/io's ChannelLastToFirst: the bytes sit at an odd
  // offset inside the protobuf record, and that function loads int16 through a cast pointer
  // (misaligned: undefined behaviour, flagged by UBSan). memcpy loads are alignment-safe and
  // compile to plain loads.
  sample.cube = Cube(shape, DType::kInt16);
  int16_t* dst = sample.cube.int16_data();
  const char* src = bytes.data();
  const int64_t voxels = shape.voxels();
  for (int64_t v = 0; v < voxels; ++v) {
    int16_t values[kMlperfChannels];
    std::memcpy(values, src + v * kMlperfChannels * sizeof(int16_t), sizeof(values));
    for (int c = 0; c < kMlperfChannels; ++c) dst[c * voxels + v] = values[c];
  }
  for (int p = 0; p < kMlperfParams; ++p) {
    const float u = y->second.floats[p];
    if (!std::isfinite(u)) {
      return DataLossError("feature 'y' value " + std::to_string(p) + " (" + kMlperfParamNames[p] +
                           ") is not finite");
    }
    sample.unit[p] = u;
    sample.physical[p] = static_cast<float>(MlperfUnitToPhysical(p, u));
  }
  return sample;
}

}  // namespace synth
}  // namespace cosmoflow
