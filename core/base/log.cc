#include "core/base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace cosmoflow {
namespace {

LogLevel InitialLevel() {
  const char* env = std::getenv("COSMOFLOW_LOG");
  if (env == nullptr) return LogLevel::INFO;
  if (!std::strcmp(env, "DEBUG")) return LogLevel::DEBUG;
  if (!std::strcmp(env, "WARNING")) return LogLevel::WARNING;
  if (!std::strcmp(env, "ERROR")) return LogLevel::ERROR;
  return LogLevel::INFO;
}

std::atomic<int> g_level{static_cast<int>(InitialLevel())};
std::atomic<int> g_rank{-1};

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
void SetLogRank(int rank) { g_rank = rank; }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

LogMessage::~LogMessage() {
  static const char kLetters[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char prefix[64];
  int rank = g_rank.load();
  int n = std::snprintf(prefix, sizeof prefix, "%c %02d:%02d:%02d.%03d ",
                        kLetters[static_cast<int>(level_)], tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  if (rank >= 0) std::snprintf(prefix + n, sizeof prefix - n, "[rank %d] ", rank);
  std::string line = std::string(prefix) + stream_.str() + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace cosmoflow
