// core/base/flags: the one tokenizer and value parsers behind every program's command line.
#include "core/base/flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cosmoflow {
namespace {

// argv from words, with a program name in front.
class Argv {
 public:
  explicit Argv(std::vector<std::string> words) : words_(std::move(words)) {
    words_.insert(words_.begin(), "prog");
    for (auto& w : words_) ptrs_.push_back(w.data());
  }
  int argc() { return int(ptrs_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> words_;
  std::vector<char*> ptrs_;
};

TEST(ParseValueTest, NumbersBoolsListsRanges) {
  EXPECT_EQ(*ParseInt("-42", "--n"), -42);
  EXPECT_DOUBLE_EQ(*ParseDouble("2.5e-3", "--x"), 2.5e-3);
  EXPECT_TRUE(*ParseBool("", "--b"));
  EXPECT_FALSE(*ParseBool("no", "--b"));
  EXPECT_EQ(*ParseDoubleList("0,0.5,3", "--z"), (std::vector<double>{0, 0.5, 3}));
  EXPECT_EQ(*ParseRange("0.25:0.35", "--r"), std::make_pair(0.25, 0.35));
  for (const auto& [status, message] : std::vector<std::pair<Status, std::string>>{
           {ParseInt("12x", "--n").status(), "--n: '12x' is not an integer"},
           {ParseInt("", "--n").status(), "--n: '' is not an integer"},
           {ParseInt("99999999999999999999", "--n").status(), "is not an integer"},
           {ParseDouble("nan", "--x").status(), "--x: 'nan' is not a finite number"},
           {ParseDouble("1e999", "--x").status(), "is not a finite number"},
           {ParseBool("maybe", "--b").status(), "--b: 'maybe' is not true or false"},
           {ParseDoubleList("", "--z").status(), "--z: empty list"},
           {ParseDoubleList("1,,2", "--z").status(), "--z: '' is not a finite number"},
           {ParseRange("3", "--r").status(), "is not a range MIN:MAX"},
           {ParseRange("2:1", "--r").status(), "has MIN > MAX"},
       }) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << message;
    EXPECT_NE(status.message().find(message), std::string::npos) << status.message();
  }
}

TEST(FlagParserTest, BindsValuesInBothSyntaxesAndKeepsDefaults) {
  std::string out = "default";
  int64_t n = 7;
  double x = 1;
  bool quiet = false, fast = true;
  FlagParser p;
  p.AddString("out", &out, "where");
  p.AddInt("samples", &n, "how many");
  p.AddDouble("lr", &x, "rate");
  p.AddBool("quiet", &quiet, "less output");
  p.AddBool("fast", &fast, "speed");
  Argv a({"--out", "dir", "--lr=0.5", "--quiet", "--fast=false", "pos"});
  std::vector<std::string> positional;
  ASSERT_TRUE(p.Parse(a.argc(), a.argv(), &positional).ok());
  EXPECT_EQ(out, "dir");
  EXPECT_EQ(n, 7);  // not given: the default stays
  EXPECT_DOUBLE_EQ(x, 0.5);
  EXPECT_TRUE(quiet);
  EXPECT_FALSE(fast);
  EXPECT_EQ(positional, std::vector<std::string>{"pos"});
  EXPECT_TRUE(p.Seen("lr"));
  EXPECT_FALSE(p.Seen("samples"));
  EXPECT_NE(p.Usage().find("--samples N"), std::string::npos) << p.Usage();
}

TEST(FlagParserTest, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus", "1"}, "unknown flag --bogus"},
      {{"--samples"}, "flag --samples needs a value"},
      {{"--samples=ten"}, "--samples: 'ten' is not an integer"},
      {{"--quiet=perhaps"}, "--quiet: 'perhaps' is not true or false"},
      {{"stray"}, "unexpected argument 'stray'"},  // no positional list given
  };
  for (const auto& [words, message] : cases) {
    int64_t n = 0;
    bool quiet = false;
    FlagParser p;
    p.AddInt("samples", &n, "");
    p.AddBool("quiet", &quiet, "");
    Argv a(words);
    Status s = p.Parse(a.argc(), a.argv(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << message;
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  }
}

TEST(FlagsTest, LookupOfWhatWasGiven) {
  Flags f({{"address", true}, {"max-batch", true}, {"tls", false}, {"verbose", false}});
  Argv a({"predict", "--address=127.0.0.1:1", "--max-batch", "8", "--tls", "--verbose=false"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv()).ok());
  EXPECT_EQ(f.Get("address"), "127.0.0.1:1");
  EXPECT_EQ(*f.GetInt("max-batch", 4), 8);
  EXPECT_DOUBLE_EQ(*f.GetDouble("timeout", 30), 30);  // not known, not given: the fallback
  EXPECT_TRUE(f.Has("tls"));
  EXPECT_FALSE(f.Has("verbose"));  // "--verbose=false" turns a boolean off
  EXPECT_EQ(f.positional(), std::vector<std::string>{"predict"});

  Flags g({{"max-batch", true}, {"tls", false}});
  Argv b({"--max-batch=many"});
  ASSERT_TRUE(g.Parse(b.argc(), b.argv()).ok());
  auto bad = g.GetInt("max-batch", 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--max-batch: 'many' is not an integer"), std::string::npos);
  Flags h({{"tls", false}});
  Argv c({"--tlss"});
  EXPECT_NE(h.Parse(c.argc(), c.argv()).message().find("unknown flag --tlss"), std::string::npos);
}

TEST(JoinCommandLineTest, QuotesWhatTheShellWouldSplit) {
  Argv a({"--out", "my dir", "--name=it's"});
  EXPECT_EQ(JoinCommandLine(a.argc(), a.argv()), "prog --out 'my dir' '--name=it'\\''s'");
}

}  // namespace
}  // namespace cosmoflow
