#include "core/base/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace cosmoflow {

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

StatusOr<bool> ParseBool(const std::string& text, const std::string& what) {
  if (text.empty() || text == "1" || text == "true" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "no") return false;
  return InvalidArgumentError(what + ": '" + text + "' is not true or false");
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

StatusOr<FlagTokens> TokenizeFlags(int argc, char** argv, int first,
                                   const std::function<int(const std::string&)>& takes_value) {
  FlagTokens out;
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      out.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const int kind = takes_value(name);
    if (kind < 0) return InvalidArgumentError("unknown flag --" + name + " (see --help)");
    if (kind == 1 && !has_value) {
      if (i + 1 >= argc) return InvalidArgumentError("flag --" + name + " needs a value");
      value = argv[++i];
    }
    // A boolean may be written "--x=false"; its value is checked by whoever reads it.
    out.flags.emplace_back(name, value);
  }
  return out;
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
           CF_ASSIGN_OR_RETURN(*value, ParseBool(v, "--" + name));
           return Status::Ok();
         }};
  f.is_bool = true;
  flags_.push_back(std::move(f));
}

const FlagParser::Flag* FlagParser::Find(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

Status FlagParser::Parse(int argc, char** argv, std::vector<std::string>* positional) {
  CF_ASSIGN_OR_RETURN(FlagTokens tokens, TokenizeFlags(argc, argv, 1, [this](const std::string& n) {
                        const Flag* f = Find(n);
                        return f == nullptr ? -1 : f->is_bool ? 0 : 1;
                      }));
  if (!tokens.positional.empty()) {
    if (positional == nullptr) {
      return InvalidArgumentError("unexpected argument '" + tokens.positional[0] + "'");
    }
    positional->insert(positional->end(), tokens.positional.begin(), tokens.positional.end());
  }
  for (const auto& [name, value] : tokens.flags) {
    Flag* f = Find(name);
    CF_RETURN_IF_ERROR(f->set(value));
    f->seen = true;
  }
  return Status::Ok();
}

bool FlagParser::Seen(const std::string& name) const {
  const Flag* f = Find(name);
  return f != nullptr && f->seen;
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

Status Flags::Parse(int argc, char** argv, int first) {
  CF_ASSIGN_OR_RETURN(FlagTokens tokens, TokenizeFlags(argc, argv, first, [this](const std::string& n) {
                        auto it = known_.find(n);
                        return it == known_.end() ? -1 : it->second ? 1 : 0;
                      }));
  for (const auto& [name, value] : tokens.flags) {
    if (known_.at(name)) {
      values_[name] = value;
      continue;
    }
    // A boolean flag: "--x" or "--x=true" sets it, "--x=false" leaves it unset.
    CF_ASSIGN_OR_RETURN(bool on, ParseBool(value, "--" + name));
    if (on) {
      values_[name] = "true";
    } else {
      values_.erase(name);
    }
  }
  positional_ = std::move(tokens.positional);
  return Status::Ok();
}

std::string Flags::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t fallback) const {
  if (!Has(name)) return fallback;
  return ParseInt(values_.at(name), "--" + name);
}

StatusOr<double> Flags::GetDouble(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  return ParseDouble(values_.at(name), "--" + name);
}

std::string JoinCommandLine(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
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

}  // namespace cosmoflow
