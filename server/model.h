// A servable model: a verified checkpoint turned into one inference Network per batch size.
//
// Load() reads and verifies the checkpoint (format, checksum, spec), builds a Network for each
// batch size 1, 2, 4, ... up to max_batch (and max_batch itself), loads the weights and warms every
// network up with one forward pass whose outputs must be finite. A batch of n cubes runs as the
// fewest of those sizes that sum to n (e.g. 3 = 2 + 1): never padded, and memory stays at about 2 x
// max_batch cubes of activations instead of max_batch^2 / 2 for one network per size. Anything that
// fails is a FAILED_PRECONDITION naming the file and the check, and no model is returned: a server
// keeps serving its previous model.
//
// Thread-safety: metadata accessors are safe from any thread. Forward() is not: only one thread
// (the batcher's worker) may call it at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/checkpoint.h"
#include "core/nn/network.h"
#include "core/nn/spec.h"

namespace cosmoflow {

struct ModelOptions {
  int max_batch = 4;
  Precision precision = Precision::kFp32;
};

class Model {
 public:
  // `path` is a checkpoint file, or a directory whose newest valid checkpoint is taken
  // (FindLatestCheckpoint).
  static StatusOr<std::shared_ptr<Model>> Load(const std::string& path,
                                               const ModelOptions& options);

  const ModelSpec& spec() const { return checkpoint_.spec; }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const std::string& path() const { return path_; }        // the resolved checkpoint file
  const std::string& version() const { return version_; }  // "<spec>-<step>-<checksum>"
  const ModelOptions& options() const { return options_; }
  double load_seconds() const { return load_seconds_; }
  // Time of one warm batch-1 forward pass, measured at load.
  double forward1_seconds() const { return forward1_seconds_; }
  double loaded_at_unix_seconds() const { return loaded_at_unix_seconds_; }
  int64_t input_elements() const;  // per cube: C * side^3
  int num_outputs() const { return int(checkpoint_.spec.outputs.size()); }

  // Runs the networks for n (1..max_batch) on n transformed cubes and writes the
  // n x P outputs de-normalised to physical units.
  void Forward(int n, const float* src, float* physical_dst);

 private:
  Model() = default;
  Checkpoint checkpoint_;
  std::string path_;
  std::string version_;
  ModelOptions options_;
  double load_seconds_ = 0;
  double forward1_seconds_ = 0;
  double loaded_at_unix_seconds_ = 0;
  std::vector<std::unique_ptr<Network>> networks_;  // largest batch first
  std::vector<float> normalised_;                   // max_batch x P scratch
};

// "<spec name>-<step, 9 digits>-<checksum>": the model version reported to clients.
std::string ModelVersion(const Checkpoint& checkpoint);

}  // namespace cosmoflow
