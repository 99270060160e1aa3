// Fuzz target: the command-line parsers. The input, split at NUL bytes, is an argv for a
// FlagParser with one flag of each kind and for Flags; each piece also goes through the value
// parsers. Properties: no crash, no sanitizer report, no uncaught exception (std::stod and friends
// throw: the parsers must not let it out); a parsed double is finite.
#include <cmath>
#include <string>
#include <vector>

#include "core/base/flags.h"
#include "fuzz/fuzz_util.h"

using namespace cosmoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args = {"prog"};
  std::string current;
  for (size_t i = 0; i < size && args.size() < 32; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current += char(data[i]);
    }
  }
  args.push_back(current);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());

  std::string s;
  int64_t n = 0;
  double d = 0;
  bool b = false;
  FlagParser parser;
  parser.AddString("out", &s, "a string");
  parser.AddInt("samples", &n, "an int");
  parser.AddDouble("lr", &d, "a double");
  parser.AddBool("verbose", &b, "a bool");
  std::vector<std::string> positional;
  if (parser.Parse(int(argv.size()), argv.data(), &positional).ok() && parser.Seen("lr"))
    FUZZ_CHECK(std::isfinite(d));

  Flags flags({{"spec", true}, {"batch", true}, {"help", false}});
  if (flags.Parse(int(argv.size()), argv.data()).ok()) {
    (void)flags.GetInt("batch", 1);
    (void)flags.GetDouble("spec", 0);
  }
  for (const std::string& a : args) {
    (void)ParseInt(a, "x");
    auto v = ParseDouble(a, "x");
    if (v.ok()) FUZZ_CHECK(std::isfinite(*v));
    (void)ParseBool(a, "x");
    (void)ParseDoubleList(a, "x");
    (void)ParseRange(a, "x");
  }
  return 0;
}
