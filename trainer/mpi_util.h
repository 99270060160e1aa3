// Small MPI helpers for the trainer: the only place outside trainer/*.cc that sees MPI types.
//
// Collective contract: every function here is collective over `comm` and must be called by all
// ranks in the same order (from the one thread that drives MPI, see STYLE.md).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/network.h"

namespace cosmoflow {

struct MpiWorld {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this node (MPI_COMM_TYPE_SHARED)
  int local_size = 1;
};
MpiWorld DescribeWorld(MPI_Comm comm);

// Every rank passes its local status; all ranks return the same one: OK if every rank was OK,
// otherwise the error of the lowest failing rank (its message is broadcast, prefixed with
// "rank N: " when N != 0). This is how setup errors on any rank stop every rank without a hang.
Status AgreeOnStatus(const Status& local, MPI_Comm comm);

// Rank 0's `text` on every rank.
std::string BroadcastString(std::string text, MPI_Comm comm);

// True on every rank iff `flag` is true on at least one rank.
bool AnyRankTrue(bool flag, MPI_Comm comm);

// Sums `values` element-wise over the ranks, in place (blocking).
void AllreduceSum(std::vector<double>& values, MPI_Comm comm);

// NetworkOptions::allreduce_sum for batch_norm's statistics: a blocking MPI_Allreduce (sum, in
// place) on `comm`, called by the training thread inside Forward/Backward. Every rank calls it in
// the same order (same network, same step), so the collectives match.
std::function<void(double* data, int n)> BatchStatisticsAllreduce(MPI_Comm comm);

// Network::Create on every rank, every rank running the same kernels: with kernel selection by
// measurement rank 0 builds (and times) first, then broadcasts its choice (PinnedKernels) and the
// other ranks build with it forced, since timings differ from rank to rank. Errors are agreed
// over the ranks (AgreeOnStatus), so all ranks return the same status.
StatusOr<std::unique_ptr<Network>> CreateNetworkOnEveryRank(const ModelSpec& spec, NetworkOptions o, MPI_Comm comm);

// True iff `checksum` is identical on every rank (weights stay in sync: the debug-mode check).
bool SameOnAllRanks(uint32_t checksum, MPI_Comm comm);

// Which ranks run on which host, for rank 0's log, e.g. "cfn1 [0-3], cfn2 [4-7]": when a host is
// lost, Slurm names the host and this line names its ranks. Hosts after the first `max_hosts` are
// counted, not listed. Other ranks get an empty string.
std::string DescribeRankHosts(MPI_Comm comm, int max_hosts = 64);

// Gathers variable-length float arrays on rank 0 in rank order (others get an empty vector).
std::vector<float> GatherToRoot(const std::vector<float>& local, MPI_Comm comm);

}  // namespace cosmoflow
