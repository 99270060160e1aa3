// A minimal command-line flag parser shared by cosmoflow-server and cosmoflow-client (header-only,
// no dependencies): "--name=value", "--name value" and boolean "--name". Unknown flags, missing
// values and malformed numbers are errors that name the flag, so a typo never passes silently.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

class Flags {
 public:
  // `known` maps every accepted flag name (without dashes) to whether it takes a value.
  explicit Flags(std::map<std::string, bool> known) : known_(std::move(known)) {}

  // Parses argv[first..argc); words that are not flags are kept as positional().
  Status Parse(int argc, char** argv, int first = 1) {
    for (int i = first; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
        positional_.push_back(arg);
        continue;
      }
      std::string name = arg.substr(2);
      std::string value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      auto it = known_.find(name);
      if (it == known_.end()) return InvalidArgumentError("unknown flag --" + name);
      if (it->second && !has_value) {
        if (i + 1 >= argc) return InvalidArgumentError("flag --" + name + " needs a value");
        value = argv[++i];
      } else if (!it->second && has_value) {
        return InvalidArgumentError("flag --" + name + " takes no value");
      }
      values_[name] = it->second ? value : "true";
    }
    return Status::Ok();
  }

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const {
    if (!Has(name)) return fallback;
    const std::string& s = values_.at(name);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0)
      return InvalidArgumentError("flag --" + name + " wants an integer, got '" + s + "'");
    return int64_t(v);
  }
  StatusOr<double> GetDouble(const std::string& name, double fallback) const {
    if (!Has(name)) return fallback;
    const std::string& s = values_.at(name);
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno != 0)
      return InvalidArgumentError("flag --" + name + " wants a number, got '" + s + "'");
    return v;
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, bool> known_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace cosmoflow
