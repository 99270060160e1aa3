// Scratch directories and whole-file helpers for every test suite (header-only).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace cosmoflow::testing {

// A fresh directory $TMPDIR/cosmoflow-<name>-XXXXXX, removed with everything in it by the
// destructor. mkdtemp makes it unique, so tests running in parallel never share one.
class TempDir {
 public:
  explicit TempDir(const std::string& name = "test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / ("cosmoflow-" + name + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();  // no scratch space: nothing can run
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace cosmoflow::testing
