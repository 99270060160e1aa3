#include "synth/importer.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>

#include "core/base/log.h"
#include "core/io/dataset.h"
#include "synth/mlperf.h"
#include "synth/tfrecord.h"

#ifndef COSMOFLOW_GIT_REV
#define COSMOFLOW_GIT_REV "unknown"
#endif

namespace cosmoflow {
namespace synth {
namespace {

// Everything read from one input file: decoded samples and the errors met on the way.
struct FileResult {
  std::string path;
  std::vector<MlperfSample> samples;
  std::vector<std::pair<int64_t, Status>> errors;  // (record number, error)
  int64_t compressed_bytes = 0;
  int64_t uncompressed_bytes = 0;
};

FileResult ReadFile(const std::string& path, int side) {
  FileResult r;
  r.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) r.compressed_bytes = st.st_size;
  auto reader = TfRecordReader::Open(path);
  if (!reader.ok()) {
    r.errors.emplace_back(0, reader.status());
    return r;
  }
  std::string record;
  while (true) {
    bool eof = false;
    const int64_t number = (*reader)->records_read();
    Status s = (*reader)->Next(&record, &eof);
    if (!s.ok()) {
      // The framing is broken: nothing after this point can be trusted.
      r.errors.emplace_back(number, s);
      break;
    }
    if (eof) break;
    auto sample = DecodeMlperfExample(record, side);
    if (!sample.ok()) {
      r.errors.emplace_back(
          number, sample.status().WithContext(path + ": record " + std::to_string(number)));
      continue;
    }
    r.samples.push_back(std::move(sample).value());
  }
  r.uncompressed_bytes = (*reader)->uncompressed_offset();
  if (r.samples.empty() && r.errors.empty()) {
    r.errors.emplace_back(0, DataLossError(path + ": no records"));
  }
  return r;
}

std::string ShardName(const ImportOptions& o, int64_t first_file) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "-%08lld.h5", static_cast<long long>(first_file));
  return o.out_dir + "/" + o.prefix + buf;
}

}  // namespace

StatusOr<std::vector<std::string>> ReadFileList(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open file list");
  std::vector<std::string> files;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.pop_back();
    }
    if (line.empty() || line[0] == '#') continue;
    files.push_back(line);
  }
  return files;
}

namespace {

Status CheckImportOptions(const ImportOptions& o) {
  if (o.out_dir.empty()) return InvalidArgumentError("import: no output directory (--out)");
  if (o.files_per_shard < 1) return InvalidArgumentError("import: files per shard must be >= 1");
  if (o.compression_level < 0 || o.compression_level > 9) {
    return InvalidArgumentError("import: compression level must be 0..9");
  }
  if (o.prefix.empty() || o.prefix.find('/') != std::string::npos) {
    return InvalidArgumentError("import: prefix '" + o.prefix + "' must be a non-empty file name");
  }
  return Status::Ok();
}

DatasetInfo MlperfDatasetInfo(const ImportOptions& o) {
  DatasetInfo info;
  info.shape = CubeShape{kMlperfChannels, o.side, o.side, o.side};
  for (int p = 0; p < kMlperfParams; ++p) {
    info.param_names.push_back(kMlperfParamNames[p]);
    info.param_units.push_back(kMlperfParamUnits[p]);
  }
  info.redshifts.assign(kMlperfRedshifts.begin(), kMlperfRedshifts.end());
  info.box_size_mpc_h = kMlperfNominalBoxMpcH * o.side / kMlperfSide;
  info.generator = "import mlperf-tfrecord (cosmoflow-import " COSMOFLOW_GIT_REV ")";
  info.has_unit_params = true;
  info.sample_fields = {kSampleBoxSize};  // each cube's own side, from its H0
  return info;
}

// Writes what ReadFile decoded, file by file, into shards of files_per_shard input files, and
// keeps the statistics and the report.
class ShardImporter {
 public:
  ShardImporter(const std::vector<std::string>& files, const ImportOptions& o, ImportStats* stats)
      : files_(files), o_(o), stats_(stats), info_(MlperfDatasetInfo(o)) {
    write_options_.compression_level = o.compression_level;
  }

  // Creates the output directory and the report; the clock of the progress lines starts here.
  Status Open() {
    std::error_code ec;  // parents too, as mkdir -p
    std::filesystem::create_directories(o_.out_dir, ec);
    if (ec) {
      return FailedPreconditionError(o_.out_dir + ": cannot create directory: " + ec.message());
    }
    if (!o_.report_path.empty()) {
      report_ = std::make_unique<std::ofstream>(o_.report_path);
      if (!*report_) return FailedPreconditionError(o_.report_path + ": cannot write the report");
      *report_ << "file\trecord\tstatus\tshard\tindex\tmessage\n";
    }
    start_ = last_progress_ = std::chrono::steady_clock::now();
    return Status::Ok();
  }

  // Input file f (in `files` order) and what was read from it.
  Status AddFile(size_t f, const FileResult& r) {
    if (f % o_.files_per_shard == 0) CF_RETURN_IF_ERROR(CloseShard());
    ++stats_->files;
    stats_->compressed_bytes += r.compressed_bytes;
    stats_->uncompressed_bytes += r.uncompressed_bytes;
    if (!r.errors.empty()) ++stats_->files_with_errors;
    CF_RETURN_IF_ERROR(RecordErrors(r));
    for (size_t i = 0; i < r.samples.size(); ++i) {
      if (!writer_) CF_RETURN_IF_ERROR(OpenShard(f / o_.files_per_shard));
      const MlperfSample& s = r.samples[i];
      std::vector<float> params(s.physical.begin(), s.physical.end());
      std::vector<float> unit(s.unit.begin(), s.unit.end());
      const double box = MlperfBoxMpcH(s.physical[3], o_.side);
      Status st = writer_->Append(s.cube, params, unit, {box});
      if (!st.ok()) return st.WithContext("import: " + shard_path_);
      if (report_) {
        *report_ << r.path << '\t' << i << "\timported\t" << shard_path_ << '\t'
                 << writer_->count() - 1 << "\t\n";
      }
      ++stats_->records;
    }
    ReportProgress(f);
    return Status::Ok();
  }

  Status CloseShard() {
    if (!writer_) return Status::Ok();
    Status s = writer_->Close();
    writer_.reset();
    if (!s.ok()) return s.WithContext("import: closing " + shard_path_);
    stats_->shards.push_back(shard_path_);
    return Status::Ok();
  }

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  // Reports (and without --skip-corrupt, returns) the errors met in one file.
  Status RecordErrors(const FileResult& r) {
    for (const auto& [record, error] : r.errors) {
      const std::string line = error.message();
      if (report_) *report_ << r.path << '\t' << record << "\tskipped\t\t\t" << line << '\n';
      if (!o_.skip_corrupt) {
        if (report_) report_->flush();
        return Status(error.code(), line + " (use --skip-corrupt to skip bad records)");
      }
      CF_LOG(WARNING) << "import: skipping " << line;
      stats_->errors.push_back(line);
      ++stats_->skipped_records;
    }
    return Status::Ok();
  }

  Status OpenShard(size_t group) {
    // The shard's sources: the files of this group (one record each in the MLPerf set).
    const size_t first = group * o_.files_per_shard;
    const size_t last = std::min(files_.size(), first + o_.files_per_shard);
    std::string sources;
    for (size_t k = first; k < last; ++k) sources += "\n  " + files_[k];
    info_.provenance =
        "cosmoflow-import (git " COSMOFLOW_GIT_REV ")\ncommand: " + o_.command_line +
        "\nlabels: params = p0 (1 + 0.1 unitPar), p0 = (0.3, 0.8, 0.96, 70); "
        "params_unit = unitPar as stored\nbox: 128 voxels span 128 H0/70 Mpc/h "
        "(attribute box_size_mpc_h: the nominal value at H0 = 70; /sample/box_size_mpc_h: "
        "each cube's own)\nsource files "
        "(corrupt records are skipped and reported):" +
        sources;
    shard_path_ = ShardName(o_, o_.first_file_number + static_cast<int64_t>(first));
    auto w = DatasetWriter::Create(shard_path_, info_, write_options_);
    if (!w.ok()) return w.status().WithContext("import");
    writer_ = std::move(w).value();
    return Status::Ok();
  }

  void ReportProgress(size_t f) {
    const auto now = std::chrono::steady_clock::now();
    if (!o_.progress || (std::chrono::duration<double>(now - last_progress_).count() <= 2.0 &&
                         f + 1 != files_.size())) {
      return;
    }
    last_progress_ = now;
    const double t = std::chrono::duration<double>(now - start_).count();
    const double rate = (f + 1) / t;
    const double eta = (files_.size() - f - 1) / rate;
    std::fprintf(stderr,
                 "import: %zu/%zu files, %lld records, %lld skipped, %.1f files/s, %.0f MB/s "
                 "(uncompressed), ETA %.0f s\n",
                 f + 1, files_.size(), static_cast<long long>(stats_->records),
                 static_cast<long long>(stats_->skipped_records), rate,
                 stats_->uncompressed_bytes / 1e6 / t, eta);
  }

  const std::vector<std::string>& files_;
  const ImportOptions& o_;
  ImportStats* stats_;
  DatasetInfo info_;
  DatasetWriteOptions write_options_;
  std::unique_ptr<std::ofstream> report_;
  std::unique_ptr<DatasetWriter> writer_;
  std::string shard_path_;
  std::chrono::steady_clock::time_point start_, last_progress_;  // set by Open
};

}  // namespace

Status ImportMlperf(const std::vector<std::string>& files, const ImportOptions& o,
                    ImportStats* stats) {
  *stats = ImportStats();
  CF_RETURN_IF_ERROR(CheckImportOptions(o));
  ShardImporter importer(files, o, stats);
  CF_RETURN_IF_ERROR(importer.Open());
  // The next file is read on another thread while this one is written.
  const int side = o.side;
  std::future<FileResult> next;
  if (!files.empty()) next = std::async(std::launch::async, ReadFile, files[0], side);
  for (size_t f = 0; f < files.size(); ++f) {
    FileResult r = next.get();
    if (f + 1 < files.size()) next = std::async(std::launch::async, ReadFile, files[f + 1], side);
    Status s = importer.AddFile(f, r);
    if (!s.ok()) {
      // Wait for the prefetch so no thread outlives the call.
      if (next.valid()) next.wait();
      return s;
    }
  }
  CF_RETURN_IF_ERROR(importer.CloseShard());
  stats->seconds = importer.seconds();
  return Status::Ok();
}

}  // namespace synth
}  // namespace cosmoflow
