// A small command-line flag parser shared by `synth` and `cosmoflow-import`: "--name value" or
// "--name=value", boolean flags without a value, positional arguments collected in order.
// Unknown flags, missing values and unparsable numbers are INVALID_ARGUMENT errors that name the
// flag; the programs print them as one line on stderr and exit with status 2.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {
namespace synth {

class FlagParser {
 public:
  explicit FlagParser(std::string program) : program_(std::move(program)) {}

  void AddString(const std::string& name, std::string* value, const std::string& help);
  void AddInt(const std::string& name, int64_t* value, const std::string& help);
  void AddDouble(const std::string& name, double* value, const std::string& help);
  void AddBool(const std::string& name, bool* value, const std::string& help);

  // Parses argv[1..argc); positional arguments are appended to *positional (an error if null).
  Status Parse(int argc, char** argv, std::vector<std::string>* positional);
  bool Seen(const std::string& name) const;
  std::string Usage() const;

 private:
  struct Flag {
    std::string name, help, kind;
    std::function<Status(const std::string&)> set;
    bool is_bool = false;
    bool seen = false;
  };
  std::string program_;
  std::vector<Flag> flags_;
};

// Parsing helpers (errors name `what`).
StatusOr<int64_t> ParseInt(const std::string& text, const std::string& what);
StatusOr<double> ParseDouble(const std::string& text, const std::string& what);
StatusOr<std::vector<double>> ParseDoubleList(const std::string& text, const std::string& what);
// "a:b" -> {a, b}
StatusOr<std::pair<double, double>> ParseRange(const std::string& text, const std::string& what);

// The command line as one shell-readable string, for provenance.
std::string JoinCommandLine(int argc, char** argv);

}  // namespace synth
}  // namespace cosmoflow
