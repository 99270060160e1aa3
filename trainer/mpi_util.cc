#include "trainer/mpi_util.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>

namespace cosmoflow {

MpiWorld DescribeWorld(MPI_Comm comm) {
  MpiWorld w;
  w.comm = comm;
  MPI_Comm_rank(comm, &w.rank);
  MPI_Comm_size(comm, &w.size);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &w.local_rank);
  MPI_Comm_size(node, &w.local_size);
  MPI_Comm_free(&node);
  return w;
}

Status AgreeOnStatus(const Status& local, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int mine = local.ok() ? size : rank;
  int first_bad = size;
  MPI_Allreduce(&mine, &first_bad, 1, MPI_INT, MPI_MIN, comm);
  if (first_bad == size) return Status::Ok();
  // The failing rank broadcasts its code and message so every rank returns the same Status.
  int code = static_cast<int>(local.code());
  MPI_Bcast(&code, 1, MPI_INT, first_bad, comm);
  std::string message = local.message();
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first_bad, comm);
  message.resize(length);
  MPI_Bcast(message.data(), length, MPI_CHAR, first_bad, comm);
  if (first_bad != 0) message = "rank " + std::to_string(first_bad) + ": " + message;
  return Status(static_cast<StatusCode>(code), message);
}

std::string BroadcastString(std::string text, MPI_Comm comm) {
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  text.resize(length);
  MPI_Bcast(text.data(), length, MPI_CHAR, 0, comm);
  return text;
}

StatusOr<std::unique_ptr<Network>> CreateNetworkOnEveryRank(const ModelSpec& spec, NetworkOptions o, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const bool agree = o.kernel_selection == KernelSelection::kMeasure && size > 1;
  StatusOr<std::unique_ptr<Network>> net = InternalError("not built");
  if (rank == 0 || !agree) net = Network::Create(spec, o);
  if (agree) {
    CF_RETURN_IF_ERROR(AgreeOnStatus(rank == 0 ? net.status() : Status::Ok(), comm));
    const std::string pinned =
        BroadcastString(rank == 0 ? FormatKernelOptions(PinnedKernels((*net)->ChosenKernels())) : "", comm);
    if (rank != 0) {
      auto kernels = ParseKernelOptions(pinned);
      if (kernels.ok()) {
        for (const auto& [key, value] : *kernels) o.kernels[key] = value;
        o.kernel_selection = KernelSelection::kRule;
        net = Network::Create(spec, o);
      } else {
        net = kernels.status().WithContext("rank 0's kernel choice '" + pinned + "'");
      }
    }
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(net.status(), comm));
  return net;
}

bool AnyRankTrue(bool flag, MPI_Comm comm) {
  int mine = flag ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm);
  return any != 0;
}

void AllreduceSum(std::vector<double>& values, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                comm);
}

std::function<void(double* data, int n)> BatchStatisticsAllreduce(MPI_Comm comm) {
  return [comm](double* data, int n) { MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_DOUBLE, MPI_SUM, comm); };
}

bool SameOnAllRanks(uint32_t checksum, MPI_Comm comm) {
  unsigned long long v[2] = {checksum, ~static_cast<unsigned long long>(checksum)};
  unsigned long long r[2] = {0, 0};
  // max(x) == x and max(~x) == ~x on all ranks iff min == max everywhere.
  MPI_Allreduce(v, r, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  int same = (r[0] == v[0] && r[1] == v[1]) ? 1 : 0, all_same = 0;
  MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, comm);
  return all_same != 0;
}

namespace {

// "0-3" or "5" for the ranks first..last.
std::string RankRange(int first, int last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

}  // namespace

std::string DescribeRankHosts(MPI_Comm comm, int max_hosts) {
  constexpr int kNameLen = 64;
  char name[kNameLen] = {};
  ::gethostname(name, kNameLen - 1);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<char> all(rank == 0 ? size_t(size) * kNameLen : 0);
  MPI_Gather(name, kNameLen, MPI_CHAR, all.data(), kNameLen, MPI_CHAR, 0, comm);
  if (rank != 0) return "";
  // Ranks of one host are usually contiguous (srun's block distribution); each run of ranks on
  // one host is one entry.
  std::ostringstream os;
  int entries = 0, first = 0;
  for (int r = 1; r <= size; ++r) {
    const char* host = &all[size_t(first) * kNameLen];
    if (r < size && std::string(&all[size_t(r) * kNameLen]) == host) continue;
    if (entries < max_hosts)
      os << (entries ? ", " : "") << host << " [" << RankRange(first, r - 1) << "]";
    ++entries;
    first = r;
  }
  if (entries > max_hosts) os << " ... (" << entries << " runs of ranks in all)";
  return os.str();
}

std::vector<float> GatherToRoot(const std::vector<float>& local, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int count = static_cast<int>(local.size());
  std::vector<int> counts(size), displs(size);
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm);
  std::vector<float> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    all.resize(total);
  }
  MPI_Gatherv(local.data(), count, MPI_FLOAT, all.data(), counts.data(), displs.data(), MPI_FLOAT,
              0, comm);
  return all;
}

}  // namespace cosmoflow
