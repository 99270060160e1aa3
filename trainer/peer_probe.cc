#include "trainer/peer_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace cosmoflow {
namespace {

constexpr int kHostLen = 64;

// A listening socket on every interface, on a port the kernel picks; -1 if that fails.
int OpenListener(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

// A non-blocking connect to host:port under way; -1 when the name does not resolve or the connect
// fails at once (then *error holds errno).
int StartConnect(const PeerProbe::Peer& p, int* error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  *error = 0;
  if (::getaddrinfo(p.address.c_str(), std::to_string(p.port).c_str(), &hints, &res) != 0 || !res) {
    *error = EADDRNOTAVAIL;  // the name does not resolve here: reported as a failed probe
    return -1;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
    *error = errno;
    ::close(fd);
    ::freeaddrinfo(res);
    return -1;
  }
  ::freeaddrinfo(res);
  return fd;
}

PeerProbe::Reach FromErrno(int error) {
  if (error == 0) return PeerProbe::Reach::kConnected;
  if (error == ECONNREFUSED) return PeerProbe::Reach::kRefused;
  if (error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH)
    return PeerProbe::Reach::kNoAnswer;
  return PeerProbe::Reach::kError;
}

const char* ReachText(PeerProbe::Reach r) {
  switch (r) {
    case PeerProbe::Reach::kConnected:
      return "answers (process alive)";
    case PeerProbe::Reach::kRefused:
      return "connection refused: process gone";
    case PeerProbe::Reach::kNoAnswer:
      return "no answer: unreachable";
    case PeerProbe::Reach::kError:
      return "probe failed (name does not resolve?)";
  }
  return "?";
}

}  // namespace

std::unique_ptr<PeerProbe> PeerProbe::Create(MPI_Comm comm) {
  int rank = 0, size = 1, port = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int fd = OpenListener(&port);
  char mine[kHostLen + 4] = {};
  ::gethostname(mine, kHostLen - 1);
  std::memcpy(mine + kHostLen, &port, sizeof port);
  std::vector<char> all(size_t(size) * sizeof mine);
  MPI_Allgather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR, comm);
  std::vector<Peer> peers(size);
  for (int r = 0; r < size; ++r) {
    const char* entry = &all[size_t(r) * sizeof mine];
    peers[r].rank = r;
    peers[r].host = std::string(entry, strnlen(entry, kHostLen));
    std::memcpy(&peers[r].port, entry + kHostLen, sizeof port);
    // A rank on this host is reached over loopback: the host name need not resolve here.
    peers[r].address = peers[r].host == mine ? "127.0.0.1" : peers[r].host;
  }
  return std::unique_ptr<PeerProbe>(new PeerProbe(rank, fd, std::move(peers)));
}

PeerProbe::~PeerProbe() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::vector<PeerProbe::Reach> PeerProbe::Probe(const std::vector<Peer>& peers,
                                               std::chrono::milliseconds wait) {
  std::vector<Reach> reach(peers.size(), Reach::kNoAnswer);
  std::vector<pollfd> fds(peers.size(), pollfd{-1, POLLOUT, 0});
  for (size_t i = 0; i < peers.size(); ++i) {
    int error = 0;
    fds[i].fd = StartConnect(peers[i], &error);
    if (fds[i].fd < 0) reach[i] = FromErrno(error);
  }
  const auto end = std::chrono::steady_clock::now() + wait;
  size_t pending = 0;
  for (const pollfd& f : fds) pending += f.fd >= 0;
  while (pending > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(fds.data(), fds.size(), int(left.count())) <= 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      int error = 0;
      socklen_t len = sizeof error;
      ::getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &error, &len);
      reach[i] = FromErrno(error);
      ::close(fds[i].fd);
      fds[i].fd = -1;  // poll ignores negative descriptors
      --pending;
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);  // still connecting: no answer within `wait`
  }
  return reach;
}

std::vector<PeerProbe::Peer> PeerProbe::Targets() const {
  std::vector<Peer> targets;
  for (const Peer& p : peers_) {
    if (p.port > 0 && p.rank != rank_ && (rank_ == 0 || p.rank == 0)) targets.push_back(p);
  }
  return targets;
}

std::string PeerProbe::Describe(std::chrono::milliseconds wait) const {
  const std::vector<Peer> targets = Targets();
  const std::vector<Reach> reach = Probe(targets, wait);
  std::ostringstream os;
  os << "probe from rank " << rank_ << ":";
  int answered = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (reach[i] == Reach::kConnected) {
      ++answered;
      continue;
    }
    os << " rank " << targets[i].rank << " (" << targets[i].host << ") " << ReachText(reach[i])
       << ";";
  }
  os << " " << answered << " of " << targets.size() << " probed ranks answer";
  return os.str();
}

}  // namespace cosmoflow
