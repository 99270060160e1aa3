// Streams MLPerf HPC CosmoFlow TFRecord files into the project's HDF5 dataset shards.
//
// Files are processed in the given order; each record is verified (both CRCs), decoded
// (mlperf.h), transposed to channel-first and appended with its physical and unit labels. While
// one file's samples are written, the next file is read and decoded on a second thread, so gzip
// inflation overlaps HDF5 writes. At most two files' records are in memory at once.
//
// Shards: consecutive groups of `files_per_shard` input files go to one shard,
// <out_dir>/<prefix>-<index of the group's first file, 8 digits>.h5, so that several processes
// given disjoint file lists (and distinct prefixes) never collide. A group whose records are all
// corrupt writes no shard. Each shard's provenance lists its source files.
//
// Corrupt input (bad CRC, truncated record or gzip stream, unparsable Example, missing feature,
// wrong size): with skip_corrupt, the record (and the rest of a file whose framing is broken) is
// skipped, and reported on stderr, in the report file and in ImportStats; without it, Run() stops
// and returns the error. Either way it is never imported silently. Records are independently
// checksummed, so the valid records before a truncation in the same file are kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {
namespace synth {

struct ImportOptions {
  std::string out_dir;  // created if missing
  std::string prefix = "mlperf";
  int files_per_shard = 64;   // one record per file in the MLPerf set: ~1 GiB per shard
  int compression_level = 0;  // 0 none, 1..9 gzip (+ shuffle) in HDF5
  bool skip_corrupt = false;
  int side = 128;                 // expected cube side
  std::string report_path;        // optional TSV: file, record, status, shard, index, message
  std::string command_line;       // recorded in provenance
  bool progress = true;           // progress lines on stderr (about every 2 s)
  int64_t first_file_number = 0;  // numbering offset for shard names (for split file lists)
};

struct ImportStats {
  int64_t files = 0;
  int64_t records = 0;          // records imported
  int64_t skipped_records = 0;  // corrupt records skipped (skip_corrupt)
  int64_t files_with_errors = 0;
  int64_t compressed_bytes = 0;    // sizes of the input files
  int64_t uncompressed_bytes = 0;  // TFRecord stream bytes consumed
  double seconds = 0;
  std::vector<std::string> shards;  // shard files written
  std::vector<std::string> errors;  // one line per skipped record/file
};

// Imports `files` (in order). Returns the first error unless skip_corrupt; I/O errors on the
// output (cannot create the directory or write a shard) are always fatal.
Status ImportMlperf(const std::vector<std::string>& files, const ImportOptions& options,
                    ImportStats* stats);

// Reads a list of paths, one per line ('#' comments and blank lines ignored).
StatusOr<std::vector<std::string>> ReadFileList(const std::string& path);

}  // namespace synth
}  // namespace cosmoflow
