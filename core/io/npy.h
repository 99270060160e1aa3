// Reading and writing single cubes as NumPy .npy files (format versions 1.0-3.0).
//
// Supported: little-endian int16 ('<i2') and float32 ('<f4'), C order only, shapes (D,H,W) (one
// channel), (C,D,H,W) with AxisLayout::kChannelFirst or (D,H,W,C) with kChannelLast. Anything else
// (Fortran order, other dtypes, big-endian, wrong rank, truncated data) is an error naming the file.
#pragma once

#include <string>

#include "core/base/status.h"
#include "core/io/cube.h"

namespace cosmoflow {

StatusOr<Cube> ReadNpy(const std::string& path, AxisLayout layout = AxisLayout::kChannelFirst);

// Writes a channel-first cube as (C,D,H,W) (or (D,H,W) when `squeeze_single_channel` and C == 1).
Status WriteNpy(const std::string& path, const Cube& cube, bool squeeze_single_channel = false);

}  // namespace cosmoflow
