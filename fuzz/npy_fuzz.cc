// Fuzz target: ReadNpy on any file contents, in both axis layouts. Properties: no crash or
// sanitizer report; never an allocation beyond what the file holds (the header is checked against
// the file size first); an accepted cube's element count matches the bytes after the header.
#include "core/io/npy.h"
#include "fuzz/fuzz_util.h"

using namespace cosmoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::ScratchPath(".npy");
  fuzz::WriteScratch(path, std::string_view(reinterpret_cast<const char*>(data), size));
  for (AxisLayout layout : {AxisLayout::kChannelFirst, AxisLayout::kChannelLast}) {
    auto cube = ReadNpy(path, layout);
    if (!cube.ok()) continue;
    const size_t payload = size_t(cube->shape().elements()) * DTypeSize(cube->dtype());
    FUZZ_CHECK(payload <= size);
  }
  return 0;
}
