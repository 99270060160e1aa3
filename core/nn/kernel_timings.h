// Measured kernel timings (NetworkOptions::kernel_selection = kMeasure) and their cache file
// (NetworkOptions::kernel_cache). Internal to core/nn.
//
// File format: UTF-8 text, one line per (problem, candidate): "<problem>\t<candidate>\t<seconds>",
// where <problem> names the pass, its shapes and layouts, the precision, the CPU's ISA, the thread
// count and kKernelTimingsVersion (docs/engine.md "Choice by measurement"). The file is a cache:
// lines it cannot read are skipped, and losing it costs one re-timing. Save() writes a temporary
// file and renames it over the old one, so readers never see half a file; of two processes saving
// at once, the last rename wins (the other's new lines are timed again next time).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "core/base/status.h"

namespace cosmoflow::nn_internal {

// Bump when a kernel changes enough that old timings no longer describe it.
constexpr int kKernelTimingsVersion = 1;

class KernelTimings {
 public:
  // Reads `path` when it exists ("" = in memory only).
  explicit KernelTimings(std::string path);

  std::optional<double> Find(const std::string& problem, const std::string& candidate) const;
  void Put(const std::string& problem, const std::string& candidate, double seconds);
  // Writes the file when Put added anything, creating its directory. Errors name the path.
  Status Save() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, std::map<std::string, double>> seconds_;
  bool dirty_ = false;
};

}  // namespace cosmoflow::nn_internal
