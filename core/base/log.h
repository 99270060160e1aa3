// Minimal leveled logging to stderr: one line per message, prefixed with time, level and (in MPI
// programs) the rank. Thread-safe: each line is written with a single fwrite.
//
//   CF_LOG(INFO) << "epoch " << e << " loss " << loss;
//
// Only rank 0 of a trainer should log progress (the trainer sets the rank with SetLogRank).
#pragma once

#include <sstream>

namespace cosmoflow {

enum class LogLevel { DEBUG = 0, INFO = 1, WARNING = 2, ERROR = 3 };

void SetLogLevel(LogLevel level);   // messages below it are dropped; default INFO ($COSMOFLOW_LOG)
void SetLogRank(int rank);          // -1 (default): no rank prefix
bool LogEnabled(LogLevel level);

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace cosmoflow

#define CF_LOG(level)                                                   \
  if (!::cosmoflow::LogEnabled(::cosmoflow::LogLevel::level)) {         \
  } else                                                                \
    ::cosmoflow::LogMessage(::cosmoflow::LogLevel::level).stream()
