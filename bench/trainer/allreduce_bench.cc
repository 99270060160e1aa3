// trainer_allreduce_bench: MPI_Allreduce (fp32 sum) time versus message size on the ranks it is
// started with; one of the measured inputs of the parallel-efficiency model in docs/training.md.
//   mpirun -np 2 trainer_allreduce_bench [MAX_MB=32] [REPEATS=20]
// Prints one line per size: bytes, median and min seconds over the repeats, and the algorithmic
// bandwidth 2 (R-1)/R * bytes / time (the bytes a ring allreduce moves per rank).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const double max_mb = argc > 1 ? std::atof(argv[1]) : 32;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
  if (rank == 0) std::printf("{\"ranks\": %d, \"sizes\": [\n", size);
  bool first = true;
  for (double mb = 0.0625; mb <= max_mb * 1.0001; mb *= 2) {
    const size_t n = static_cast<size_t>(mb * (1 << 20) / 4);
    std::vector<float> buf(n, 1.0f);
    std::vector<double> times;
    for (int r = 0; r < repeats + 2; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      const double t = MPI_Wtime() - t0;
      if (r >= 2) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double bytes = static_cast<double>(n) * 4;
    if (rank == 0) {
      std::printf(
          "%s  {\"bytes\": %.0f, \"median_s\": %.6g, \"min_s\": %.6g, \"algbw_gb_s\": %.3f}",
          first ? "" : ",\n", bytes, median, times.front(),
          2.0 * (size - 1) / size * bytes / median / 1e9);
      first = false;
    }
  }
  if (rank == 0) std::printf("\n]}\n");
  MPI_Finalize();
  return 0;
}
