// Which peer is lost, when a collective hangs: a blocked MPI collective does not say whom it waits
// for, so each rank keeps a listening TCP socket open for the life of the run and the ranks learn
// each other's (host, port) at start-up. When the watchdog fires, a rank probes its peers with
// plain TCP connects (no MPI call, so it is safe from the watchdog's thread while the training
// thread sits in MPI): the peer's kernel completes the handshake of a listening socket without the
// process doing anything, so
//   - connected           : the host answers and the process is alive (frozen or stuck is possible)
//   - connection refused  : the host answers but the process is gone
//   - no answer in time   : the host is unreachable (cable cut, host down)
// Rank 0 probes every other rank; the others probe rank 0 (so a lost rank 0 is named too, without
// an N^2 storm of connects at scale).
//
// Thread-safety: Create is collective over `comm` (training thread, at setup); Describe may be
// called from any one thread afterwards.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace cosmoflow {

class PeerProbe {
 public:
  struct Peer {
    int rank = 0;
    std::string host;
    int port = 0;         // 0: that rank could not open its socket; not probed
    std::string address;  // what to connect to: host, or 127.0.0.1 for a rank on this host
  };
  enum class Reach { kConnected, kRefused, kNoAnswer, kError };

  // Collective. Opens this rank's socket and gathers every rank's (host, port).
  static std::unique_ptr<PeerProbe> Create(MPI_Comm comm);
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  // Probes this rank's targets for at most `wait` and returns one line for the log, e.g.
  // "probe from rank 0: rank 1 (cfn2:41234) no answer in 2 s: unreachable".
  std::string Describe(std::chrono::milliseconds wait) const;

  // Connects to each peer at once (non-blocking) and waits at most `wait` in all.
  static std::vector<Reach> Probe(const std::vector<Peer>& peers, std::chrono::milliseconds wait);

 private:
  PeerProbe(int rank, int listen_fd, std::vector<Peer> peers)
      : rank_(rank), listen_fd_(listen_fd), peers_(std::move(peers)) {}
  std::vector<Peer> Targets() const;

  const int rank_;
  const int listen_fd_;  // kept open: the kernel answers probes on it
  const std::vector<Peer> peers_;
};

}  // namespace cosmoflow
