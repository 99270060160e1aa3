// The MLPerf HPC CosmoFlow sample format (cosmoUniverse_2019_05_4parE_tf_v2), decoded: the one
// place that knows its feature names, sizes and label mapping
// (../shared/data/mlperf-cosmoflow/README.md documents the format).
//
//   feature "x": bytes_list, one value of side^3 x 4 little-endian int16 particle counts, laid out
//                channel-last, index ((i * side + j) * side + k) * 4 + c; channels are the
//                redshifts 0, 0.5, 1.5, 3.
//   feature "y": float_list of 4 "unitPar" values u in [-1, 1] for (Omega_M, sigma_8, n_s, H0),
//                physical p = p0 (1 + 0.1 u), p0 = (0.3, 0.8, 0.96, 70).
// One 128^3 cube spans 128 * H0/70 Mpc/h in the source simulation (512 Mpc/h boxes scaled by H0/70,
// cut into 64 cubes), i.e. a nominal 1 Mpc/h per voxel at H0 = 70.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "core/base/status.h"
#include "core/io/cube.h"

namespace cosmoflow {
namespace synth {

inline constexpr int kMlperfSide = 128;
inline constexpr int kMlperfChannels = 4;
inline constexpr int kMlperfParams = 4;
inline constexpr std::array<double, kMlperfChannels> kMlperfRedshifts = {0.0, 0.5, 1.5, 3.0};
inline constexpr std::array<const char*, kMlperfParams> kMlperfParamNames = {"Omega_M", "sigma_8",
                                                                             "n_s", "H0"};
inline constexpr std::array<const char*, kMlperfParams> kMlperfParamUnits = {"", "", "",
                                                                             "km/s/Mpc"};
inline constexpr std::array<double, kMlperfParams> kMlperfParamCentre = {0.3, 0.8, 0.96, 70.0};
inline constexpr double kMlperfUnitScale = 0.1;
inline constexpr double kMlperfNominalBoxMpcH = 128.0;  // at H0 = 70; see above

// p = p0 (1 + 0.1 u) and its inverse.
inline double MlperfUnitToPhysical(int param, double u) {
  return kMlperfParamCentre[param] * (1.0 + kMlperfUnitScale * u);
}
inline double MlperfPhysicalToUnit(int param, double p) {
  return (p / kMlperfParamCentre[param] - 1.0) / kMlperfUnitScale;
}

// Side in Mpc/h of a cube of `side` voxels with Hubble constant h0 (km/s/Mpc): the source boxes
// are fixed in Mpc, so in Mpc/h they scale as H0/70.
inline double MlperfBoxMpcH(double h0, int side = kMlperfSide) {
  return kMlperfNominalBoxMpcH * side / kMlperfSide * h0 / kMlperfParamCentre[3];
}

struct MlperfSample {
  Cube cube;                                // int16, channel-first (4, side, side, side)
  std::array<float, kMlperfParams> unit{};  // unitPar as stored
  std::array<float, kMlperfParams> physical{};
};

// Decodes one serialized tf.train.Example. Errors (DATA_LOSS / INVALID_ARGUMENT) name the problem:
// missing feature, wrong list type, wrong byte count ("expected side^3 x 4 x 2"), wrong number of
// labels, non-finite labels. `side` is the expected cube side (128 for the real data).
StatusOr<MlperfSample> DecodeMlperfExample(std::string_view record, int side = kMlperfSide);

}  // namespace synth
}  // namespace cosmoflow
