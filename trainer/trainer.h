// The training driver behind cosmoflow-train: synchronous data-parallel training over MPI ranks.
//
// Collective: every rank of `world` calls RunTraining with the same options. Rank 0 alone logs
// progress, writes checkpoints, the run log (OUT/train_log.csv, OUT/run.json) and the validation
// predictions (OUT/val_predictions.csv). Setup errors on any rank are agreed on (mpi_util.h) so
// that all ranks stop together and rank 0 prints one line; nothing hangs.
//
// Returns the process exit code: 0 finished, 1 bad input or runtime error, kRequeueExitCode (75)
// after a SIGUSR1/SIGTERM stop with a checkpoint written (the batch script requeues the job).
#pragma once

#include <string>

#include "trainer/mpi_util.h"
#include "trainer/options.h"

namespace cosmoflow {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

int RunTraining(const TrainerOptions& options, const MpiWorld& world,
                const std::string& command_line);

}  // namespace cosmoflow
