// The admin surface (server/admin.h) over real gRPC on loopback: ReloadModel is off by default,
// needs a token or an admin client certificate, and may only name checkpoints under the root;
// refusals never open the named file and do not depend on what exists outside the root.
#include "server/admin.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;
using grpc::StatusCode;

// True when some process has `fifo` open for reading: opening a FIFO for writing without blocking
// fails with ENXIO when nobody reads it. A server that tried to load the FIFO would sit in open().
bool FifoHasReader(const std::string& fifo) {
  int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

class AdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteTinyCheckpoint(root_ / "a.h5", /*seed=*/1, /*step=*/10);
    WriteTinyCheckpoint(root_ / "b.h5", /*seed=*/2, /*step=*/20);
    WriteTinyCheckpoint(outside_ / "outside.h5", /*seed=*/3, /*step=*/30);
    ASSERT_EQ(::mkfifo((root_ / "fifo.h5").c_str(), 0600), 0);
    ASSERT_EQ(::mkfifo((outside_ / "fifo.h5").c_str(), 0600), 0);
    token_ = WriteAdminToken(secrets_ / "token");
  }

  ServerOptions Options(bool admin) {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.checkpoint = root_ / "a.h5";
    o.watch_interval = std::chrono::milliseconds(0);
    if (admin) {
      o.admin.enabled = true;
      o.admin.token_file = secrets_ / "token";
    }
    return o;
  }

  void StartServer(const ServerOptions& o) {
    auto s = InferenceServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->LoadInitialModel().ok());
    stub_ = v1::CosmoFlow::NewStub(LoopbackChannel(server_->port()));
  }

  grpc::Status Reload(const std::string& path, const std::string& token,
                      v1::ReloadModelResponse* resp = nullptr) {
    v1::ReloadModelRequest req;
    req.set_checkpoint_path(path);
    v1::ReloadModelResponse ignored;
    auto ctx = AdminContext(token, /*seconds=*/30);
    return stub_->ReloadModel(ctx.get(), req, resp ? resp : &ignored);
  }

  int64_t ServedStep() { return server_->model()->checkpoint().state.step; }

  TempDir root_{"admin-root"}, outside_{"admin-outside"}, secrets_{"admin-secrets"};
  std::string token_;
  std::unique_ptr<InferenceServer> server_;
  std::unique_ptr<v1::CosmoFlow::Stub> stub_;
};

TEST_F(AdminTest, DisabledByDefaultAnswersUnimplementedWithoutOpeningTheFile) {
  StartServer(Options(/*admin=*/false));
  for (const std::string& token : {std::string(), token_}) {
    for (const std::string& path : {root_ / "b.h5", root_ / "fifo.h5", std::string()}) {
      grpc::Status s = Reload(path, token);
      EXPECT_EQ(s.error_code(), StatusCode::UNIMPLEMENTED) << path << ": " << s.error_message();
      EXPECT_NE(s.error_message().find("--enable-admin"), std::string::npos) << s.error_message();
    }
  }
  EXPECT_FALSE(FifoHasReader(root_ / "fifo.h5"));
  EXPECT_EQ(ServedStep(), 10);
}

TEST_F(AdminTest, MissingOrWrongTokenIsRefusedWithoutOpeningTheFile) {
  StartServer(Options(/*admin=*/true));
  EXPECT_EQ(Reload(root_ / "fifo.h5", "").error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Reload(root_ / "b.h5", "").error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Reload(root_ / "fifo.h5", token_ + "x").error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Reload(root_ / "b.h5", token_.substr(1)).error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Reload(root_ / "b.h5", "wrong").error_code(), StatusCode::PERMISSION_DENIED);
  // Another scheme than Bearer is no credential at all.
  v1::ReloadModelRequest req;
  req.set_checkpoint_path(root_ / "b.h5");
  v1::ReloadModelResponse resp;
  auto ctx = ContextWithDeadline(30);
  ctx->AddMetadata("authorization", "Basic " + token_);
  EXPECT_EQ(stub_->ReloadModel(ctx.get(), req, &resp).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(FifoHasReader(root_ / "fifo.h5"));
  EXPECT_EQ(ServedStep(), 10);
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_requests_total",
                        "code=\"PERMISSION_DENIED\",method=\"ReloadModel\""),
            3);
}

TEST_F(AdminTest, TheTokenAllowsCheckpointsUnderTheRoot) {
  StartServer(Options(/*admin=*/true));
  v1::ReloadModelResponse resp;
  grpc::Status s = Reload("b.h5", token_, &resp);  // relative: taken from the root
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.changed());
  EXPECT_EQ(resp.model().step(), 20);
  EXPECT_EQ(ServedStep(), 20);
  s = Reload(root_ / "a.h5", token_, &resp);  // absolute, under the root
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServedStep(), 10);
  s = Reload("", token_, &resp);  // empty: the server's own --checkpoint
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.changed());
  // A checkpoint under the root that fails verification names itself (the root is the
  // operator's own): FAILED_PRECONDITION, old model kept.
  std::ofstream(root_ / "junk.h5") << "junk";
  s = Reload("junk.h5", token_);
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("junk.h5"), std::string::npos) << s.error_message();
  EXPECT_EQ(ServedStep(), 10);
}

TEST_F(AdminTest, PathsOutsideTheRootGetOneAnswerWhetherOrNotTheyExist) {
  StartServer(Options(/*admin=*/true));
  const std::string up = fs::relative(outside_.path(), root_.path()).string();  // "../admin-..."
  ASSERT_EQ(up.substr(0, 3), "../");
  fs::create_symlink(outside_ / "outside.h5", root_ / "link-to-existing.h5");
  fs::create_symlink(outside_ / "missing.h5", root_ / "link-to-missing.h5");
  fs::create_symlink(outside_.path(), root_ / "dir-link");
  const std::vector<std::string> refused = {
      outside_ / "outside.h5",  outside_ / "missing.h5",  outside_ / "fifo.h5",
      up + "/outside.h5",       up + "/missing.h5",       root_ / ("../" + up + "/outside.h5"),
      "link-to-existing.h5",    "link-to-missing.h5",     "dir-link/outside.h5",
      "dir-link/missing.h5",    "missing.h5",             "/etc/passwd",
      "/no/such/dir/x.h5",      root_ / "../",            std::string("a.h5\0x", 6)};
  std::string first_message;
  for (const std::string& path : refused) {
    grpc::Status s = Reload(path, token_);
    EXPECT_EQ(s.error_code(), StatusCode::PERMISSION_DENIED) << path << ": " << s.error_message();
    if (first_message.empty()) first_message = s.error_message();
    EXPECT_EQ(s.error_message(), first_message) << path;
    EXPECT_EQ(s.error_message().find(outside_.path()), std::string::npos) << s.error_message();
  }
  EXPECT_FALSE(FifoHasReader(outside_ / "fifo.h5"));
  EXPECT_EQ(ServedStep(), 10);
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_model_reloads_total",
                        "result=\"failure\""),
            0)
      << "no load was even attempted";
}

TEST_F(AdminTest, AnExplicitRootAndADirectoryCheckpoint) {
  TempDir ckpts("admin-ckpts");
  ASSERT_TRUE(SaveCheckpointToDir(ckpts / "run1", MakeTinyCheckpoint(4, 40), 3).ok());
  ServerOptions o = Options(/*admin=*/true);
  o.admin.checkpoint_root = ckpts.path();
  StartServer(o);
  // The initial --checkpoint need not be under the root; reloads must be.
  grpc::Status s = Reload("run1", token_);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServedStep(), 40);
  EXPECT_EQ(Reload(root_ / "b.h5", token_).error_code(), StatusCode::PERMISSION_DENIED);
}

TEST_F(AdminTest, SighupAndTheWatcherWorkWithAdminDisabled) {
  TempDir dir("admin-watch");
  ASSERT_TRUE(SaveCheckpointToDir(dir.path(), MakeTinyCheckpoint(1, 100), 3).ok());
  ServerOptions o = Options(/*admin=*/false);
  o.checkpoint = dir.path();
  o.watch_interval = std::chrono::milliseconds(100);
  StartServer(o);
  auto wait_for_step = [&](int64_t step) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (ServedStep() != step && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return ServedStep();
  };
  ASSERT_TRUE(SaveCheckpointToDir(dir.path(), MakeTinyCheckpoint(2, 200), 3).ok());
  EXPECT_EQ(wait_for_step(200), 200);
  server_.reset();
  // SIGHUP's path (RequestReload) with the watcher off: a checkpoint written meanwhile is taken.
  o.watch_interval = std::chrono::milliseconds(0);
  StartServer(o);
  ASSERT_TRUE(SaveCheckpointToDir(dir.path(), MakeTinyCheckpoint(3, 300), 3).ok());
  server_->RequestReload();
  EXPECT_EQ(wait_for_step(300), 300);
}

TEST_F(AdminTest, BadAdminConfigurationsAreStartUpErrors) {
  auto start_error = [&](const ServerOptions& o) {
    auto s = InferenceServer::Start(o);
    return s.ok() ? std::string() : s.status().message();
  };
  ServerOptions o = Options(/*admin=*/true);
  o.admin.token_file.clear();
  EXPECT_NE(start_error(o).find("needs a credential"), std::string::npos);
  o = Options(/*admin=*/false);
  o.admin.token_file = secrets_ / "token";
  EXPECT_NE(start_error(o).find("need --enable-admin"), std::string::npos);
  o = Options(/*admin=*/true);
  o.admin.client_cert_name = "cf-admin";
  EXPECT_NE(start_error(o).find("--tls-client-ca"), std::string::npos);
  o = Options(/*admin=*/true);
  o.admin.token_file = secrets_ / "missing";
  EXPECT_NE(start_error(o).find("not a readable file"), std::string::npos);
  WriteAdminToken(secrets_ / "short", "short");
  o.admin.token_file = secrets_ / "short";
  EXPECT_NE(start_error(o).find("fewer than 16"), std::string::npos);
  WriteAdminToken(secrets_ / "open", token_);
  fs::permissions(secrets_ / "open", fs::perms::others_read, fs::perm_options::add);
  o.admin.token_file = secrets_ / "open";
  EXPECT_NE(start_error(o).find("other users"), std::string::npos);
  o = Options(/*admin=*/true);
  o.admin.checkpoint_root = root_ / "no-such-dir";
  EXPECT_NE(start_error(o).find("not a directory"), std::string::npos);
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abcdef0123456789", "abcdef0123456789"));
  EXPECT_FALSE(ConstantTimeEquals("abcdef012345678", "abcdef0123456789"));
  EXPECT_FALSE(ConstantTimeEquals("abcdef01234567890", "abcdef0123456789"));
  EXPECT_FALSE(ConstantTimeEquals("bbcdef0123456789", "abcdef0123456789"));
  EXPECT_FALSE(ConstantTimeEquals("", "abcdef0123456789"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("abcdef0123456789\0", 17), "abcdef0123456789"));
}

// mTLS: a certificate whose CN is the admin name may reload; another certificate from the same CA
// is served but is not an admin.
class AdminTlsTest : public AdminTest {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TempDir("admin-pki");
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::string script = "cd " + pki_->path() + " && set -e && openssl req -x509" + key +
                         " -keyout ca.key -out ca.pem -days 2 -subj /CN=cf-test-ca && "
                         "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext";
    for (const std::string cn : {"localhost", "cf-admin", "cf-client"})
      script += " && openssl req" + key + " -keyout " + cn + ".key -out " + cn + ".csr -subj /CN=" +
                cn + " && openssl x509 -req -in " + cn + ".csr -CA ca.pem -CAkey ca.key " +
                "-CAcreateserial -days 2 -extfile san.ext -out " + cn + ".pem";
    ASSERT_EQ(std::system((script + " > openssl.log 2>&1").c_str()), 0)
        << ReadFileText(*pki_ / "openssl.log");
  }
  static void TearDownTestSuite() { delete pki_; }

  void StartTls() {
    ServerOptions o = Options(/*admin=*/true);
    o.tls_cert = *pki_ / "localhost.pem";
    o.tls_key = *pki_ / "localhost.key";
    o.tls_client_ca = *pki_ / "ca.pem";
    o.admin.client_cert_name = "cf-admin";
    StartServer(o);
  }

  void UseCertificate(const std::string& cn) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFileText(*pki_ / "ca.pem");
    ssl.pem_cert_chain = ReadFileText(*pki_ / (cn + ".pem"));
    ssl.pem_private_key = ReadFileText(*pki_ / (cn + ".key"));
    stub_ = v1::CosmoFlow::NewStub(
        LoopbackChannel(server_->port(), grpc::SslCredentials(ssl), "localhost"));
  }

  static TempDir* pki_;
};
TempDir* AdminTlsTest::pki_ = nullptr;

TEST_F(AdminTlsTest, TheAdminCertificateOrTheTokenAllowsReloads) {
  StartTls();
  UseCertificate("cf-client");
  EXPECT_EQ(Reload("b.h5", "").error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Reload("b.h5", "wrong").error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ServedStep(), 10);
  grpc::Status s = Reload("b.h5", token_);  // the token works over TLS too
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServedStep(), 20);
  UseCertificate("cf-admin");
  s = Reload("a.h5", "");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServedStep(), 10);
  EXPECT_EQ(Reload(outside_ / "outside.h5", "").error_code(), StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace cosmoflow
