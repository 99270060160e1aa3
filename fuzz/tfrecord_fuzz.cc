// Fuzz target: the MLPerf importer's input path on untrusted bytes. The input is a TFRecord file
// (plain; gzip goes through the same reader after zlib); every record it yields is decoded as a
// tf.train.Example and as an MLPerf sample (side 4), and the input itself is also decoded as one
// Example. Properties: no crash or sanitizer report; errors are statuses; a decoded sample has the
// shape it was asked for and finite labels; at most one record is held at a time (bounded length).
#include <cmath>

#include "fuzz/fuzz_util.h"
#include "synth/mlperf.h"
#include "synth/tfrecord.h"

using namespace cosmoflow;

namespace {

void DecodeRecord(std::string_view record) {
  auto features = synth::ParseExample(record);
  if (features.ok())
    for (const auto& [name, f] : *features) (void)synth::FeatureKindName(f.kind);
  auto sample = synth::DecodeMlperfExample(record, /*side=*/4);
  if (!sample.ok()) return;
  FUZZ_CHECK(sample->cube.shape().channels == 4 && sample->cube.shape().depth == 4);
  for (float v : sample->physical) FUZZ_CHECK(std::isfinite(v));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  DecodeRecord(bytes);
  const std::string& path = fuzz::ScratchPath(".tfrecord");
  fuzz::WriteScratch(path, bytes);
  auto reader = synth::TfRecordReader::Open(path);
  FUZZ_CHECK(reader.ok());  // the file exists: opening never depends on its contents
  std::string record;
  for (int i = 0; i < 64; ++i) {
    bool eof = false;
    Status s = (*reader)->Next(&record, &eof);
    if (!s.ok() || eof) break;
    FUZZ_CHECK(record.size() <= size);
    DecodeRecord(record);
  }
  return 0;
}
