// Command-line flags for every program of the project (synth, cosmoflow-import, cosmoflow-train,
// cosmoflow-server, cosmoflow-client, the benchmarks): one tokenizer, one set of value parsers.
//
// Syntax: "--name=value", "--name value", and "--name" alone for a boolean flag; any word that
// does not start with "--" is positional; a boolean may also be written "--name=false". Unknown
// flags, a missing value, malformed numbers and booleans are INVALID_ARGUMENT errors whose message
// names the flag, so a typo never passes silently. Programs print the message as one line on stderr and
// exit with status 2.
//
// Two ways to read the flags, over the same tokenizer:
//   FlagParser  binds each flag to a variable and can print a usage table (synth, import);
//   Flags       is a lookup table of what was given (server, client, benchmarks).
// The trainer, which also reads a JSON config with the same keys, uses TokenizeFlags directly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

// Value parsers. Errors name `what` (usually "--flag") and quote the text.
StatusOr<int64_t> ParseInt(const std::string& text, const std::string& what);
StatusOr<double> ParseDouble(const std::string& text, const std::string& what);  // finite only
// "", "1", "true", "yes" -> true; "0", "false", "no" -> false.
StatusOr<bool> ParseBool(const std::string& text, const std::string& what);
// "a,b,c" -> {a, b, c}; an empty list is an error.
StatusOr<std::vector<double>> ParseDoubleList(const std::string& text, const std::string& what);
// "a:b" -> {a, b} with a <= b.
StatusOr<std::pair<double, double>> ParseRange(const std::string& text, const std::string& what);

struct FlagTokens {
  std::vector<std::pair<std::string, std::string>> flags;  // in command-line order; bools get ""
  std::vector<std::string> positional;
};

// Splits argv[first..argc). `takes_value(name)` returns 1 if the flag takes a value, 0 if it is a
// boolean, -1 if there is no such flag.
StatusOr<FlagTokens> TokenizeFlags(int argc, char** argv, int first,
                                   const std::function<int(const std::string&)>& takes_value);

// Binds flags to variables; a flag that is not given leaves its variable unchanged (the default).
class FlagParser {
 public:
  void AddString(const std::string& name, std::string* value, const std::string& help);
  void AddInt(const std::string& name, int64_t* value, const std::string& help);
  void AddDouble(const std::string& name, double* value, const std::string& help);
  void AddBool(const std::string& name, bool* value, const std::string& help);  // "--x", "--x=false"

  // Parses argv[1..argc); positional arguments are appended to *positional (an error if null).
  Status Parse(int argc, char** argv, std::vector<std::string>* positional);
  bool Seen(const std::string& name) const;
  std::string Usage() const;  // one line per flag, in the order they were added

 private:
  struct Flag {
    std::string name, help, kind;
    std::function<Status(const std::string&)> set;
    bool is_bool = false;
    bool seen = false;
  };
  const Flag* Find(const std::string& name) const;
  Flag* Find(const std::string& name) {
    return const_cast<Flag*>(static_cast<const FlagParser*>(this)->Find(name));
  }
  std::vector<Flag> flags_;
};

// What was given, by name. `known` maps every accepted flag name (without dashes) to whether it
// takes a value; a boolean flag that was given reads as "true".
class Flags {
 public:
  explicit Flags(std::map<std::string, bool> known) : known_(std::move(known)) {}

  Status Parse(int argc, char** argv, int first = 1);
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, bool> known_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// The command line as one shell-readable string, for provenance records.
std::string JoinCommandLine(int argc, char** argv);

}  // namespace cosmoflow
