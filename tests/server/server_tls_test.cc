// TLS: a self-signed CA made with the openssl CLI at test time; server certificate, optional client
// certificates; plaintext clients are refused.
#include <gtest/gtest.h>

#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string d = dir_->path();
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "cd " + d + " && set -e && " + "openssl req -x509" + key +
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=cf-test-ca && " + "openssl req" + key +
        " -keyout server.key -out server.csr -subj /CN=localhost && " +
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && " +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
        "-days 2 "
        "-extfile san.ext && " +
        "openssl req" + key + " -keyout client.key -out client.csr -subj /CN=cf-client && " +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
        "-days 2 && " +
        // A second CA, to make a client certificate the server must not trust.
        "openssl req -x509" + key + " -keyout other.key -out other.pem -days 2 -subj /CN=other-ca";
    ASSERT_EQ(std::system((script + " > openssl.log 2>&1").c_str()), 0)
        << ReadFileText(d + "/openssl.log");
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override { checkpoint_ = WriteTinyCheckpoint(ckpt_dir_ / "a.h5", 1); }

  void Start(bool client_certs) {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.checkpoint = checkpoint_;
    o.watch_interval = std::chrono::milliseconds(0);
    o.tls_cert = *dir_ / "server.pem";
    o.tls_key = *dir_ / "server.key";
    if (client_certs) o.tls_client_ca = *dir_ / "ca.pem";
    auto s = InferenceServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->LoadInitialModel().ok());
  }

  grpc::Status Call(std::shared_ptr<grpc::ChannelCredentials> creds,
                    const std::string& host = "localhost") {
    auto stub = v1::CosmoFlow::NewStub(LoopbackChannel(server_->port(), creds, host));
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline(10);
    return stub->Predict(ctx.get(), MakeInt16Request(RandomCounts(1, kVoxels)), &resp);
  }

  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& cert_prefix = "") {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFileText(*dir_ / "ca.pem");
    if (!cert_prefix.empty()) {
      ssl.pem_cert_chain = ReadFileText(*dir_ / (cert_prefix + ".pem"));
      ssl.pem_private_key = ReadFileText(*dir_ / (cert_prefix + ".key"));
    }
    return grpc::SslCredentials(ssl);
  }

  static TempDir* dir_;
  TempDir ckpt_dir_;
  std::string checkpoint_;
  std::unique_ptr<InferenceServer> server_;
};
TempDir* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, ServerCertificateOnly) {
  Start(/*client_certs=*/false);
  grpc::Status s = Call(Tls());
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Call(grpc::InsecureChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, ClientCertificatesRequired) {
  Start(/*client_certs=*/true);
  grpc::Status s = Call(Tls("client"));
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Call(Tls()).error_code(), grpc::StatusCode::UNAVAILABLE) << "no client certificate";
  EXPECT_EQ(Call(grpc::InsecureChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A certificate from a CA the server does not trust: the "other" CA's own self-signed cert.
  EXPECT_EQ(Call(Tls("other")).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MissingOrBadPemFilesAreStartUpErrors) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.checkpoint = checkpoint_;
  o.tls_cert = *dir_ / "nope.pem";
  o.tls_key = *dir_ / "server.key";
  auto s = InferenceServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("nope.pem"), std::string::npos) << s.status().message();
  o.tls_cert = *dir_ / "san.ext";  // exists, not PEM
  s = InferenceServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("is not PEM"), std::string::npos) << s.status().message();
  o.tls_cert = "";
  s = InferenceServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("needs both"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace cosmoflow
