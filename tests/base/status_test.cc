#include "core/base/status.h"

#include <gtest/gtest.h>

namespace cosmoflow {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  CF_ASSIGN_OR_RETURN(int h, Half(x));
  CF_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = NotFoundError("no such file: a.h5");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: no such file: a.h5");
  EXPECT_EQ(s.WithContext("loading").message(), "loading: no such file: a.h5");
}

TEST(StatusTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);  // 6 -> 3 is odd
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

}  // namespace
}  // namespace cosmoflow
