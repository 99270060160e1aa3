// PeerProbe::Probe (trainer/peer_probe.h) on loopback: a listening socket answers, a closed port is
// refused. "No answer" (a cut cable) needs a host that drops packets: tests/trainer/
// multihost_test.sh checks it on a namespace host. (No unresolvable-name case: it would ask DNS.)
#include "trainer/peer_probe.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace cosmoflow {
namespace {

// A loopback socket bound to a kernel-chosen port; listening or not.
int Bound(bool listening, int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  if (listening) {
    EXPECT_EQ(::listen(fd, 4), 0);
  }
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST(PeerProbeTest, ListeningSocketAnswersClosedPortRefuses) {
  int open_port = 0, closed_port = 0;
  const int open_fd = Bound(true, &open_port);
  const int closed_fd = Bound(false, &closed_port);  // bound, never listening: RST on connect
  const std::vector<PeerProbe::Peer> peers = {{1, "a", open_port, "127.0.0.1"},
                                              {2, "b", closed_port, "127.0.0.1"}};
  const auto reach = PeerProbe::Probe(peers, std::chrono::milliseconds(2000));
  ASSERT_EQ(reach.size(), 2u);
  EXPECT_EQ(reach[0], PeerProbe::Reach::kConnected);
  EXPECT_EQ(reach[1], PeerProbe::Reach::kRefused);
  ::close(open_fd);
  ::close(closed_fd);
}

}  // namespace
}  // namespace cosmoflow
