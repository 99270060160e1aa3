#include "core/nn/kernel_timings.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cosmoflow::nn_internal {

KernelTimings::KernelTimings(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::ifstream in(path_);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find('\t');
    const size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
    if (b == std::string::npos) continue;
    char* end = nullptr;
    const std::string number = line.substr(b + 1);
    const double s = std::strtod(number.c_str(), &end);
    if (end == number.c_str() || *end != '\0' || !std::isfinite(s) || s <= 0) continue;
    seconds_[line.substr(0, a)][line.substr(a + 1, b - a - 1)] = s;
  }
}

std::optional<double> KernelTimings::Find(const std::string& problem, const std::string& candidate) const {
  auto p = seconds_.find(problem);
  if (p == seconds_.end()) return std::nullopt;
  auto c = p->second.find(candidate);
  if (c == p->second.end()) return std::nullopt;
  return c->second;
}

void KernelTimings::Put(const std::string& problem, const std::string& candidate, double seconds) {
  seconds_[problem][candidate] = seconds;
  dirty_ = true;
}

Status KernelTimings::Save() const {
  if (path_.empty() || !dirty_) return Status::Ok();
  std::error_code ec;
  const auto dir = std::filesystem::path(path_).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError(path_ + ": cannot create its directory: " + ec.message());
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& [problem, by_candidate] : seconds_) {
      for (const auto& [candidate, s] : by_candidate) {
        char text[32];
        std::snprintf(text, sizeof text, "%.6g", s);
        out << problem << '\t' << candidate << '\t' << text << '\n';
      }
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return UnavailableError(path_ + ": cannot write the kernel timings");
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return UnavailableError(path_ + ": cannot rename the kernel timings into place: " + why);
  }
  return Status::Ok();
}

}  // namespace cosmoflow::nn_internal
