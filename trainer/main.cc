// cosmoflow-train: data-parallel training of a CosmoFlow model over MPI ranks. A thin shell over
// the trainer library (trainer.h); see docs/training.md and `cosmoflow-train --help`.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "core/base/log.h"
#include "trainer/mpi_util.h"
#include "trainer/options.h"
#include "trainer/signals.h"
#include "trainer/trainer.h"

int main(int argc, char** argv) {
  // First thing: Slurm's --signal may arrive while MPI is still starting (on a loaded node, or a
  // requeued job whose warning time has already passed); the default action of SIGUSR1 would kill
  // the rank and fail the job instead of checkpointing at the first step boundary.
  cosmoflow::InstallStopSignalHandlers();
  // MPI is called by the training thread and, during backward only, by the gradient
  // communication thread, never at the same time (SERIALIZED); the prefetch thread never calls it.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  // A rank that dies must take the job down rather than leave the others waiting in a collective.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  const cosmoflow::MpiWorld world = cosmoflow::DescribeWorld(MPI_COMM_WORLD);
  cosmoflow::SetLogRank(world.size > 1 ? world.rank : -1);

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  bool help = false;
  auto options = cosmoflow::ParseTrainerOptions(argc, argv, &help);
  int code = cosmoflow::kExitOk;
  if (help) {
    if (world.rank == 0) std::fputs(cosmoflow::UsageText().c_str(), stdout);
  } else if (!options.ok()) {
    // Every rank parsed the same arguments, so all of them take this branch; rank 0 says why.
    if (world.rank == 0) {
      std::fprintf(stderr, "cosmoflow-train: error: %s\n", options.status().message().c_str());
    }
    code = cosmoflow::kExitUsage;
  } else {
    code = cosmoflow::RunTraining(*options, world, command_line);
  }
  MPI_Finalize();
  return code;
}
