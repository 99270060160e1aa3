// TensorBoard event files, written by rank 0 next to train_log.csv (the same rows as scalars).
//
// Format (what TensorFlow's EventFileWriter writes and TensorBoard reads): a file named
// events.out.tfevents.<unix seconds>.<host>.<pid> holding TFRecords, each
//   uint64 length (LE) | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of data
// whose data is a tensorflow.Event protobuf. The first event carries file_version "brain.Event:2";
// each later one a Summary of simple_value scalars at one step. The few protobuf fields used are
// encoded here by hand (field numbers from the public event.proto and summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// Every record is flushed at once, so a killed job keeps all but at most a torn last record (which
// TensorBoard's reader skips).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

class TensorBoardWriter {
 public:
  // Creates a new events file in `dir` (which must exist); a restarted run adds a new file, and
  // TensorBoard shows the files of a directory as one run.
  static StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with the scalars (tag, value); values are stored as float32.
  void WriteScalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {}
  void WriteRecord(const std::string& data);

  std::FILE* file_;
  std::string path_;
};

}  // namespace cosmoflow
