// Request validation: every cube is checked here before anything reaches the network.
//
// ValidateCube accepts exactly what cosmoflow.proto documents and returns INVALID_ARGUMENT with a
// message naming the field and the problem otherwise (wrong rank or extents for the model, unknown
// dtype or layout value, byte length that does not match the shape, NaN/Inf or negative values).
// It never reads outside `cube.data()` and never aborts, whatever the bytes: the fuzz test
// (tests/server/validate_test.cc) feeds it random messages.
//
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/io/cube.h"
#include "core/nn/spec.h"
#include "proto/cosmoflow.pb.h"

namespace cosmoflow {

// What the loaded model takes: channel-first [C, side, side, side].
struct ExpectedInput {
  int channels = 0;
  int side = 0;
};

// A validated cube: a view of the request's bytes (valid while the request message lives).
struct CubeView {
  CubeShape shape;  // channel-first extents
  DType dtype = DType::kInt16;
  AxisLayout layout = AxisLayout::kChannelFirst;
  const void* data = nullptr;  // shape.elements() * DTypeSize(dtype) bytes, any alignment
};

// `field` prefixes messages, e.g. "cube" or "requests[3].cube".
StatusOr<CubeView> ValidateCube(const v1::Cube& cube, const ExpectedInput& expected,
                                const std::string& field = "cube");

// Converts a validated cube to the network's input: channel-first float32, passed through the
// model's input transform. dst has shape.elements() floats.
void CubeToNetworkInput(const CubeView& cube, InputTransform transform, float* dst);

}  // namespace cosmoflow
