// Helpers shared by the synth tests: the real MLPerf samples and gzip files (scratch directories
// and whole-file helpers come from tests/common/files.h).
#pragma once

#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/files.h"

namespace cosmoflow {
namespace synth {
namespace testing {

using ::cosmoflow::testing::ReadAll;
using ::cosmoflow::testing::TempDir;
using ::cosmoflow::testing::WriteAll;

inline std::string RealDataDir() {
  return std::string(COSMOFLOW_SHARED_DIR) + "/data/mlperf-cosmoflow";
}

// The three real files, sorted; empty if ../shared is absent (tests then skip and say why).
inline std::vector<std::string> RealFiles() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(RealDataDir(), ec)) {
    if (e.path().extension() == ".tfrecord") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

#define CF_REQUIRE_REAL_DATA(files)                                                          \
  if ((files).size() < 3) {                                                                  \
    GTEST_SKIP() << "the three real MLPerf TFRecords are not in "                            \
                 << ::cosmoflow::synth::testing::RealDataDir()                               \
                 << " (COSMOFLOW_SHARED_DIR/data/mlperf-cosmoflow): nothing real to import"; \
  }

// Whole decompressed content of a gzip file.
inline std::string Gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string out;
  char buf[1 << 16];
  int n;
  while (f && (n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  if (f) gzclose(f);
  return out;
}

inline void WriteGzip(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb1");
  gzwrite(f, data.data(), static_cast<unsigned>(data.size()));
  gzclose(f);
}

// Runs a shell command; returns its exit status and fills *err with its stderr.
inline int RunCommand(const std::string& command, const std::string& err_file,
                      std::string* err = nullptr) {
  const int rc = std::system((command + " >/dev/null 2>" + err_file).c_str());
  if (err) *err = ReadAll(err_file);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace testing
}  // namespace synth
}  // namespace cosmoflow
