// Helpers shared by the synth tests: the real MLPerf samples and temporary directories.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cosmoflow {
namespace synth {
namespace testing {

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

// A fresh directory under the build tree (removed at the end of the test).
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ = std::string(COSMOFLOW_BINARY_DIR) + "/tmp-synth-tests/" + name + "-" +
            std::to_string(::getpid());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& f) const { return path_ + "/" + f; }

 private:
  std::string path_;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
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

}  // namespace testing
}  // namespace synth
}  // namespace cosmoflow
