#include "trainer/run_log.h"

#include <sys/stat.h>

namespace cosmoflow {

StatusOr<RunLog> RunLog::Open(const std::string& path, const std::vector<std::string>& output_names,
                              const std::string& tensorboard_dir) {
  struct stat st;
  const bool fresh = ::stat(path.c_str(), &st) != 0 || st.st_size == 0;
  RunLog log;
  log.file_ = std::fopen(path.c_str(), "a");
  if (!log.file_) return NotFoundError(path + ": cannot open the run log for writing");
  log.outputs_ = output_names.size();
  log.names_ = output_names;
  if (!tensorboard_dir.empty()) {
    CF_ASSIGN_OR_RETURN(log.events_, TensorBoardWriter::Create(tensorboard_dir));
  }
  if (fresh) {
    std::string header = "kind,epoch,step,samples_seen,lr,loss,mae";
    for (const auto& n : output_names) header += ",rel_err_" + n;
    header += ",samples_per_s,data_wait_frac,comm_frac,elapsed_s\n";
    std::fputs(header.c_str(), log.file_);
    std::fflush(log.file_);
  }
  return log;
}

RunLog::~RunLog() {
  if (file_) std::fclose(file_);
}

void RunLog::Write(const LogRow& r) {
  if (!file_) return;
  auto opt = [this](double v) {
    if (v < 0)
      std::fputs(",", file_);
    else
      std::fprintf(file_, ",%.6g", v);
  };
  std::fprintf(file_, "%s,%lld,%lld,%lld,%.6g,%.6g", r.kind.c_str(),
               static_cast<long long>(r.epoch), static_cast<long long>(r.step),
               static_cast<long long>(r.samples_seen), r.lr, r.loss);
  opt(r.mae);
  for (size_t i = 0; i < outputs_; ++i) opt(i < r.rel_err.size() ? r.rel_err[i] : -1);
  opt(r.samples_per_s);
  opt(r.data_wait_frac);
  opt(r.comm_frac);
  std::fprintf(file_, ",%.3f\n", r.elapsed_s);
  std::fflush(file_);
  if (events_) WriteEvents(r);
}

void RunLog::WriteEvents(const LogRow& r) {
  std::vector<std::pair<std::string, double>> scalars;
  const std::string k = r.kind + "/";
  scalars.emplace_back(k + "loss", r.loss);
  if (r.kind == "train") {
    scalars.emplace_back(k + "learning_rate", r.lr);
    scalars.emplace_back(k + "samples_per_s", r.samples_per_s);
    scalars.emplace_back(k + "data_wait_frac", r.data_wait_frac);
    scalars.emplace_back(k + "comm_frac", r.comm_frac);
  } else {
    scalars.emplace_back(k + "mae", r.mae);
    for (size_t i = 0; i < names_.size() && i < r.rel_err.size(); ++i)
      scalars.emplace_back(k + "rel_err_" + names_[i], r.rel_err[i]);
  }
  events_->WriteScalars(r.step, scalars);
}

}  // namespace cosmoflow
