// The `cosmoflow-import` program (synth/import_main.cc), run as a user runs it.
#include <gtest/gtest.h>

#include <string>

#include "core/io/dataset.h"
#include "test_util.h"

namespace cosmoflow {
namespace synth {
namespace {

using testing::RealFiles;
using testing::RunCommand;
using testing::TempDir;

const std::string kImport = std::string(COSMOFLOW_BINARY_DIR) + "/synth/cosmoflow-import";

TEST(ImportCliTest, ExitStatusSaysWhatHappened) {
  auto files = RealFiles();
  CF_REQUIRE_REAL_DATA(files);
  TempDir dir("import-cli");
  std::string stream = testing::Gunzip(files[0]);
  stream.resize(stream.size() / 2);  // truncated record
  testing::WriteGzip(dir / "cut.tfrecord", stream);
  testing::WriteAll(dir / "list.txt",
                    files[0] + "\n" + dir / "cut.tfrecord" + "\n" + files[1] + "\n");
  std::string err;
  EXPECT_EQ(RunCommand(kImport + " --out " + dir / "o1" + " --files-from " + dir / "list.txt",
                       dir / "err", &err),
            1);
  EXPECT_NE(err.find("cut.tfrecord"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_EQ(RunCommand(kImport + " --out " + dir / "o2" + " --files-from " + dir / "list.txt" +
                           " --skip-corrupt",
                       dir / "err", &err),
            3)
      << err;
  EXPECT_NE(err.find("1 corrupt records skipped"), std::string::npos) << err;
  // The shard is named after the list.
  auto d = Dataset::Open(dir / "o2/list-00000000.h5");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->size(), 2);
  EXPECT_EQ(RunCommand(kImport + " --out " + dir / "o3 " + files[2], dir / "err", &err), 0) << err;
  EXPECT_NE(err.find("MB/s"), std::string::npos) << err;
  EXPECT_EQ(RunCommand(kImport + " --out " + dir / "o4", dir / "err", &err), 2);
  EXPECT_NE(err.find("no input files"), std::string::npos) << err;
  EXPECT_EQ(RunCommand(kImport + " " + files[2], dir / "err", &err), 2);
  EXPECT_NE(err.find("--out"), std::string::npos) << err;
}

}  // namespace
}  // namespace synth
}  // namespace cosmoflow
