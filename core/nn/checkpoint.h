// Checkpoints: one HDF5 file each, everything needed to serve a model and to resume training.
//
// File layout (format version 1, documented in docs/formats.md):
//   attributes on /: format "cosmoflow-checkpoint", format_version 1, spec_json (ModelSpec::ToJson),
//     step, epoch, samples_seen, rng_seed, optimizer (name), provenance_json (string map),
//     checksum: CRC-32C (hex) over spec_json and every tensor's name, shape and bytes, in file order.
//   /weights/<name>    float32 tensors in plain layout (see tensor.h)
//   /optimizer/<name>  float32 optimizer state tensors (e.g. "adam.m.conv0.weights")
// Version 2 adds an uncertainty head in the spec and the optional attribute calibration_json
// (CalibrationToJson, covered by the checksum). A checkpoint without either is written as version
// 1, so builds that predate them keep reading it; they refuse a version 2 file by its version.
// Version 3: a calibration with sigma_exponent / sigma_reference (a power calibration), which a
// version-2 reader would silently apply as a plain factor; other checkpoints keep version 1 or 2.
// Version 4: a calibration with sigma_edge (an edge term), which a version-3 reader would ignore.
// Writes go to "<path>.tmp.<pid>" in the same directory, fsync, rename, fsync the directory, so a
// reader sees the old file or the complete new one, never a partial one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/spec.h"
#include "core/nn/tensor.h"
#include "core/nn/uncertainty.h"

namespace cosmoflow {

inline constexpr int kCheckpointFormatVersion = 4;  // the newest version this build reads and writes

struct TrainingState {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t samples_seen = 0;
  uint64_t rng_seed = 0;
  std::string optimizer;  // "adam", "sgd", "" (none)
};

struct Checkpoint {
  ModelSpec spec;
  std::vector<NamedTensor> weights;
  std::vector<NamedTensor> optimizer_state;
  TrainingState state;
  std::map<std::string, std::string> provenance;  // dataset, ranks, git revision, command, ...
  Calibration calibration;                        // sigma factors fitted on validation (may be empty)
  std::string checksum;                           // filled by Read/Write: 8 hex digits
};

// Atomic write (see above). Fills ckpt.checksum if given a non-const pointer via the return value.
StatusOr<std::string> WriteCheckpoint(const std::string& path, const Checkpoint& ckpt);
// Reads and verifies format, version, spec, calibration and checksum; the error says which check
// failed.
StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// A directory of checkpoints "ckpt-<step 9 digits>.h5" with a pointer file "LATEST" holding the
// file name of the newest one (updated atomically after the checkpoint itself is in place).
// Saves, updates LATEST, and deletes all but the newest `keep_last` checkpoints.
StatusOr<std::string> SaveCheckpointToDir(const std::string& dir, const Checkpoint& ckpt, int keep_last);
// Path of the newest checkpoint in `dir` that passes verification, trying LATEST first then the
// others newest first; corrupt ones are skipped with a warning. NotFound if none.
StatusOr<std::string> FindLatestCheckpoint(const std::string& dir);

// A temporary file of an interrupted save in a checkpoint directory:
// "ckpt-<9 digits>.h5.tmp.<pid>" or "LATEST.tmp.<pid>", written by process <pid>.
struct TemporaryCheckpointFile {
  std::string path;
  int64_t writer_pid = 0;
  bool writer_alive = false;  // kept: the writer may still be saving
  bool removed = false;       // the writer was gone and the file was deleted
};

// Deletes the temporary files in `dir` whose writer no longer runs (kill(pid, 0) fails with ESRCH;
// a process of another user counts as alive) and keeps those of live writers, which may still be
// saving. Returns every temporary file found, for the caller to log. Only this host's processes
// are seen: a directory shared with a writer on another node must not be cleaned this way.
std::vector<TemporaryCheckpointFile> RemoveStaleTemporaryFiles(const std::string& dir);

}  // namespace cosmoflow
