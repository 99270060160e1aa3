// HDF5 dataset shards: the one on-disk format for training, validation and test cubes.
//
// Layout of a shard (schema version 1, documented in docs/formats.md):
//   /cubes   [N, C, D, H, W] int16 particle counts, chunked one cube per chunk, optional gzip
//            (deflate) + shuffle; N grows as cubes are appended (unlimited first dimension).
//   /params  [N, P] float32 physical parameter values (e.g. Omega_M, sigma_8, n_s).
//   root attributes:
//     schema             "cosmoflow-dataset"       schema_version  int = 1
//     param_names        P strings                 param_units     P strings ("" = dimensionless)
//     redshifts          C doubles (z of each channel)
//     box_size_mpc_h     double (side of one cube in Mpc/h)
//     generator          string (e.g. "synth 0.1.0 seed=7", "import mlperf-tfrecord")
//     provenance         string (free text: command line, git revision, source files)
//   /params_unit [N, P] float32 (optional): the labels in the source's own unit scale (MLPerf unitPar).
//   /sample/<name> [N] float64 (optional, one per name in the attribute sample_fields): a value per
//            cube, e.g. box_size_mpc_h (when it varies from cube to cube, as with H0), group (the
//            parent universe of a sub-cube), subcube (its position in the parent).
//
// Thread-safety: HDF5 (Debian's serial build) is not thread-safe; every call into this module takes
// one process-wide lock, so readers on several threads are safe but serialised.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/io/cube.h"

namespace cosmoflow {

inline constexpr int kDatasetSchemaVersion = 1;

struct DatasetInfo {
  CubeShape shape;                       // per cube
  std::vector<std::string> param_names;  // P names
  std::vector<std::string> param_units;  // P units, "" for dimensionless
  std::vector<double> redshifts;         // C values (may be empty if unknown)
  double box_size_mpc_h = 0;
  std::string generator;
  std::string provenance;
  bool has_unit_params = false;          // /params_unit present
  std::vector<std::string> sample_fields;  // names of the /sample/<name> per-cube values
};

// Per-cube value names written by this project's tools.
inline constexpr char kSampleBoxSize[] = "box_size_mpc_h";  // side of this cube in Mpc/h
inline constexpr char kSampleGroup[] = "group";             // parent universe of a sub-cube
inline constexpr char kSampleSubcube[] = "subcube";         // (i * n + j) * n + k in its parent

struct DatasetWriteOptions {
  int compression_level = 0;  // 0 = none, 1..9 = gzip with byte shuffle
};

// Appends cubes one at a time. The file is written to "<path>.tmp" and renamed into place by
// Close(), so a crash never leaves a half-written shard under the final name.
class DatasetWriter {
 public:
  static StatusOr<std::unique_ptr<DatasetWriter>> Create(const std::string& path,
                                                         const DatasetInfo& info,
                                                         const DatasetWriteOptions& options = {});
  ~DatasetWriter();  // without Close(): the temporary file is removed

  // `cube` must be int16 with info.shape; params has P values; unit_params P values or empty;
  // sample_values one value per info.sample_fields name (or empty when there are none).
  Status Append(const Cube& cube, const std::vector<float>& params,
                const std::vector<float>& unit_params = {},
                const std::vector<double>& sample_values = {});
  int64_t count() const { return count_; }
  // Flushes, fsyncs and renames the file into place.
  Status Close();

 private:
  DatasetWriter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t count_ = 0;
};

// Random access to one shard without loading it.
class DatasetReader {
 public:
  // Verifies the schema, shapes and attributes; errors name the file and the problem.
  static StatusOr<std::unique_ptr<DatasetReader>> Open(const std::string& path);
  ~DatasetReader();

  const std::string& path() const { return path_; }
  const DatasetInfo& info() const { return info_; }
  int64_t size() const { return size_; }

  StatusOr<Cube> ReadCube(int64_t index) const;
  // Reads cube `index` as int16 into dst[info().shape.elements()].
  Status ReadCubeInto(int64_t index, int16_t* dst) const;
  StatusOr<std::vector<float>> ReadParams(int64_t index) const;
  // All N x P parameter values, row-major.
  StatusOr<std::vector<float>> ReadAllParams() const;
  StatusOr<std::vector<float>> ReadAllUnitParams() const;
  // All N values of /sample/<name>; NOT_FOUND if the shard has no such field.
  StatusOr<std::vector<double>> ReadSampleField(const std::string& name) const;

 private:
  DatasetReader() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  DatasetInfo info_;
  int64_t size_ = 0;
};

// A dataset = one shard file, or every *.h5 file of a directory (sorted by name). All shards must
// agree on cube shape and parameter names. Global sample index i maps to (shard, local index).
class Dataset {
 public:
  static StatusOr<std::unique_ptr<Dataset>> Open(const std::string& file_or_dir);

  int64_t size() const { return total_; }
  const DatasetInfo& info() const { return shards_.front()->info(); }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const DatasetReader& shard(int i) const { return *shards_[i]; }

  Status ReadCubeInto(int64_t index, int16_t* dst) const;
  StatusOr<Cube> ReadCube(int64_t index) const;
  StatusOr<std::vector<float>> ReadParams(int64_t index) const;

 private:
  std::vector<std::unique_ptr<DatasetReader>> shards_;
  std::vector<int64_t> offsets_;  // offsets_[s] = first global index of shard s
  int64_t total_ = 0;
};

// Reads one cube from an HDF5 file: `dataset_path` names a [N,C,D,H,W], [C,D,H,W] or [D,H,W] array
// of int16 or float32; `index` selects along N for 5-D arrays (must be 0 otherwise).
StatusOr<Cube> ReadHdf5Cube(const std::string& path, const std::string& dataset_path,
                            int64_t index = 0);

}  // namespace cosmoflow
