// Fuzz target: a cosmoflow.v1 PredictRequest as it arrives off the wire (any bytes), validated for
// two model inputs and, when accepted, converted with every input transform. Properties: no crash
// or sanitizer report; an accepted cube has exactly the expected shape and byte count; the
// transforms read only the validated bytes (ASan) and write only the output buffer.
#include <vector>

#include "fuzz/fuzz_util.h"
#include "proto/cosmoflow.pb.h"
#include "server/validate.h"

using namespace cosmoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::PredictRequest request;
  if (!request.ParseFromArray(data, int(size))) return 0;
  for (const ExpectedInput expected : {ExpectedInput{1, 8}, ExpectedInput{2, 4}}) {
    auto view = ValidateCube(request.cube(), expected);
    if (!view.ok()) {
      FUZZ_CHECK(view.status().code() == StatusCode::kInvalidArgument);
      continue;
    }
    FUZZ_CHECK(view->shape.channels == expected.channels);
    FUZZ_CHECK(view->shape.elements() ==
               int64_t(expected.channels) * expected.side * expected.side * expected.side);
    FUZZ_CHECK(request.cube().data().size() == size_t(view->shape.elements()) * DTypeSize(view->dtype));
    std::vector<float> dst(size_t(view->shape.elements()));
    for (InputTransform t : {InputTransform::kNone, InputTransform::kLog1p,
                             InputTransform::kDivideByMean, InputTransform::kOverdensity})
      CubeToNetworkInput(*view, t, dst.data());
  }
  return 0;
}
