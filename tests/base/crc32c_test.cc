#include "core/base/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace cosmoflow {
namespace {

// Known-answer values from RFC 3720 (iSCSI) appendix B.4.
TEST(Crc32cTest, KnownAnswers) {
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  std::string inc(32, 0);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(inc.data(), inc.size()), 0x46dd794eu);
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
}

TEST(Crc32cTest, IncrementalEqualsWhole) {
  std::string s = "The quick brown fox jumps over the lazy dog, thirteen times over.";
  uint32_t whole = Crc32c(s.data(), s.size());
  uint32_t part = Crc32c(s.data(), 10);
  part = Crc32c(s.data() + 10, s.size() - 10, part);
  EXPECT_EQ(whole, part);
}

}  // namespace
}  // namespace cosmoflow
