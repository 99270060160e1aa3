// The run log written by rank 0: OUT/train_log.csv, one row per progress point ("train") and per
// validation ("val"). Columns (stable, read by tools/plot_training.py):
//   kind,epoch,step,samples_seen,lr,loss,mae,rel_err_<output>...,samples_per_s,data_wait_frac,
//   comm_frac,elapsed_s
// Empty cells where a value does not apply (mae and rel_err on train rows). The file is appended to
// across restarts of the same run (a requeued job continues the same log); readers keep the last
// row for a given (kind, step). With a TensorBoard directory, every row is also written as scalars
// to an events file there (trainer/tensorboard.h): train/loss, train/learning_rate,
// train/samples_per_s, train/data_wait_frac, train/comm_frac; val/loss, val/mae,
// val/rel_err_<output>; the step is the row's step.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "trainer/tensorboard.h"

namespace cosmoflow {

struct LogRow {
  std::string kind;  // "train" | "val"
  int64_t epoch = 0, step = 0, samples_seen = 0;
  double lr = 0, loss = 0;
  double mae = -1;              // < 0: empty
  std::vector<double> rel_err;  // empty: empty cells
  double samples_per_s = -1, data_wait_frac = -1, comm_frac = -1;
  double elapsed_s = 0;
};

class RunLog {
 public:
  // `tensorboard_dir` empty: no events file.
  static StatusOr<RunLog> Open(const std::string& path, const std::vector<std::string>& output_names,
                               const std::string& tensorboard_dir = "");
  RunLog(RunLog&& o) noexcept
      : file_(o.file_), outputs_(o.outputs_), names_(std::move(o.names_)), events_(std::move(o.events_)) {
    o.file_ = nullptr;
  }
  RunLog& operator=(RunLog&&) = delete;
  ~RunLog();
  void Write(const LogRow& row);  // flushed at once, so a killed job keeps its log

 private:
  RunLog() = default;
  void WriteEvents(const LogRow& row);

  std::FILE* file_ = nullptr;
  size_t outputs_ = 0;
  std::vector<std::string> names_;  // the outputs, for val/rel_err_<name>
  std::unique_ptr<TensorBoardWriter> events_;
};

}  // namespace cosmoflow
