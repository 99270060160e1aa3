#include "synth/cli.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace cosmoflow {
namespace synth {

StatusOr<int64_t> ParseInt(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    return InvalidArgumentError(what + ": '" + text + "' is not an integer");
  }
  return static_cast<int64_t>(v);
}

StatusOr<double> ParseDouble(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    return InvalidArgumentError(what + ": '" + text + "' is not a finite number");
  }
  return v;
}

StatusOr<std::vector<double>> ParseDoubleList(const std::string& text, const std::string& what) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    CF_ASSIGN_OR_RETURN(double v, ParseDouble(item, what));
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgumentError(what + ": empty list");
  return out;
}

StatusOr<std::pair<double, double>> ParseRange(const std::string& text, const std::string& what) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    return InvalidArgumentError(what + ": '" + text + "' is not a range MIN:MAX");
  }
  CF_ASSIGN_OR_RETURN(double lo, ParseDouble(text.substr(0, colon), what));
  CF_ASSIGN_OR_RETURN(double hi, ParseDouble(text.substr(colon + 1), what));
  if (lo > hi) return InvalidArgumentError(what + ": '" + text + "' has MIN > MAX");
  return std::make_pair(lo, hi);
}

void FlagParser::AddString(const std::string& name, std::string* value, const std::string& help) {
  flags_.push_back({name, help, "STR", [value](const std::string& v) {
                      *value = v;
                      return Status::Ok();
                    }});
}

void FlagParser::AddInt(const std::string& name, int64_t* value, const std::string& help) {
  flags_.push_back({name, help, "N", [value, name](const std::string& v) {
                      CF_ASSIGN_OR_RETURN(*value, ParseInt(v, "--" + name));
                      return Status::Ok();
                    }});
}

void FlagParser::AddDouble(const std::string& name, double* value, const std::string& help) {
  flags_.push_back({name, help, "X", [value, name](const std::string& v) {
                      CF_ASSIGN_OR_RETURN(*value, ParseDouble(v, "--" + name));
                      return Status::Ok();
                    }});
}

void FlagParser::AddBool(const std::string& name, bool* value, const std::string& help) {
  Flag f{name, help, "", [value, name](const std::string& v) {
           if (v.empty() || v == "1" || v == "true") {
             *value = true;
           } else if (v == "0" || v == "false") {
             *value = false;
           } else {
             return InvalidArgumentError("--" + name + ": '" + v + "' is not true/false");
           }
           return Status::Ok();
         }};
  f.is_bool = true;
  flags_.push_back(std::move(f));
}

Status FlagParser::Parse(int argc, char** argv, std::vector<std::string>* positional) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      if (positional == nullptr) return InvalidArgumentError("unexpected argument '" + arg + "'");
      positional->push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = nullptr;
    for (auto& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) return InvalidArgumentError("unknown flag --" + name + " (see --help)");
    if (!has_value && !flag->is_bool) {
      if (i + 1 >= argc) return InvalidArgumentError("flag --" + name + " needs a value");
      value = argv[++i];
    }
    CF_RETURN_IF_ERROR(flag->set(value));
    flag->seen = true;
  }
  return Status::Ok();
}

bool FlagParser::Seen(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return f.seen;
  }
  return false;
}

std::string FlagParser::Usage() const {
  std::ostringstream s;
  for (const auto& f : flags_) {
    std::string left = "  --" + f.name + (f.kind.empty() ? "" : " " + f.kind);
    if (left.size() < 28) left.resize(28, ' ');
    s << left << " " << f.help << "\n";
  }
  return s.str();
}

std::string JoinCommandLine(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool quote = a.empty() || a.find_first_of(" \t'\"$") != std::string::npos;
    if (i) out += ' ';
    if (quote) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += q + "'";
    } else {
      out += a;
    }
  }
  return out;
}

}  // namespace synth
}  // namespace cosmoflow
