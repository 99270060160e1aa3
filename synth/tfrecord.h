// Reading TFRecord files and tf.train.Example records without TensorFlow.
//
// TFRecord framing (tensorflow/core/lib/io/record_writer.h), repeated until end of file:
//   uint64 length (little-endian) | uint32 masked CRC-32C of the 8 length bytes |
//   length bytes of data          | uint32 masked CRC-32C of the data
// with masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (core/base/crc32c.h). Files may be
// gzip-compressed (the MLPerf CosmoFlow files are) or plain: zlib's gzread reads both.
//
// tf.train.Example (tensorflow/core/example/{example,feature}.proto), decoded with a minimal
// protobuf wire-format reader (varint, 64-bit, length-delimited and 32-bit fields; unknown fields
// skipped, groups rejected):
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }   // map entry: { string key = 1; Feature value
//   = 2; } Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List
//   int64_list = 3; } } BytesList { repeated bytes value = 1; }  FloatList { repeated float value =
//   1 [packed]; } Int64List { repeated int64 value = 1 [packed]; }
// Every length is bounds-checked: a corrupt record yields a DATA_LOSS status, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {
namespace synth {

// Streams records from one file; holds one record in memory at a time. Not thread-safe.
class TfRecordReader {
 public:
  // Records longer than this are refused (a corrupt length must not allocate gigabytes).
  static constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 30;

  static StatusOr<std::unique_ptr<TfRecordReader>> Open(const std::string& path);
  ~TfRecordReader();

  // Reads the next record into *record, verifying both CRCs. At a clean end of file returns OK
  // with *eof = true. Errors (DATA_LOSS) name the file, the record number and the byte offset:
  // bad length or data CRC, truncated header/data/footer, gzip stream errors.
  Status Next(std::string* record, bool* eof);

  const std::string& path() const { return path_; }
  int64_t records_read() const { return records_; }
  int64_t uncompressed_offset() const { return offset_; }  // bytes of TFRecord stream consumed

 private:
  TfRecordReader() = default;
  // Reads exactly n bytes unless the stream ends; *got is what was read. Errors start with `where`.
  Status ReadFully(void* dst, size_t n, size_t* got, const std::string& where);

  std::string path_;
  void* gz_ = nullptr;  // gzFile
  int64_t records_ = 0;
  int64_t offset_ = 0;
};

// One feature of a tf.train.Example. Byte values point into the record they were parsed from,
// which must outlive the feature.
struct ExampleFeature {
  enum class Kind { kBytes, kFloat, kInt64 };
  Kind kind = Kind::kBytes;
  std::vector<std::string_view> bytes;
  std::vector<float> floats;
  std::vector<int64_t> ints;
};

const char* FeatureKindName(ExampleFeature::Kind kind);  // "bytes_list", "float_list", "int64_list"

// Parses a serialized tf.train.Example. Errors (DATA_LOSS) say which message and offset is bad.
StatusOr<std::map<std::string, ExampleFeature>> ParseExample(std::string_view record);

// Builds the TFRecord framing around `data` (for tests and tools that write records).
std::string FrameTfRecord(std::string_view data);

// Minimal protobuf encoders (for tests and fixtures): a length-delimited field, and a
// tf.train.Example with the given bytes and float features.
std::string EncodeLengthDelimited(int field, std::string_view payload);
std::string EncodeExample(const std::map<std::string, std::string>& bytes_features,
                          const std::map<std::string, std::vector<float>>& float_features);

}  // namespace synth
}  // namespace cosmoflow
