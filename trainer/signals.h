// Stop requests from the batch system: SIGUSR1 (Slurm's warning before the time limit, see
// --signal in deploy/slurm) and SIGTERM (scancel, preemption) set a flag; the training loop reads
// it at each step boundary, the ranks agree (see mpi_util.h AnyRankTrue) and all of them checkpoint
// and exit with kRequeueExitCode. The handler only stores to a lock-free atomic: async-signal-safe,
// and safe to read from the training thread whichever thread took the signal.
#pragma once

namespace cosmoflow {

// sysexits.h EX_TEMPFAIL: "temporary failure, the user is invited to retry". The batch script
// requeues the job when the trainer exits with it.
inline constexpr int kRequeueExitCode = 75;

// Installs the handlers (idempotent). SA_RESTART so that HDF5 reads are not interrupted.
void InstallStopSignalHandlers();
// True once SIGUSR1 or SIGTERM arrived in this process.
bool StopRequested();
// The signal number that set the flag (0 if none), for the log line.
int StopSignal();
// For tests: clears the flag.
void ResetStopRequest();

}  // namespace cosmoflow
