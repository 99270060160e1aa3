// A servable model: a verified checkpoint, or an ensemble of them, turned into one inference
// Network per batch size (per member).
//
// Load() reads and verifies the checkpoint (format, checksum, spec), builds a Network for each
// batch size 1, 2, 4, ... up to max_batch (and max_batch itself), loads the weights and warms every
// network up with one forward pass whose outputs must be finite. A batch of n cubes runs as the
// fewest of those sizes that sum to n (e.g. 3 = 2 + 1): never padded, and memory stays at about 2 x
// max_batch cubes of activations instead of max_batch^2 / 2 for one network per size. Anything that
// fails is a FAILED_PRECONDITION naming the file and the check, and no model is returned: a server
// keeps serving its previous model.
//
// Uncertainty: a checkpoint whose spec has an uncertainty head yields a posterior mean and
// covariance per cube; an ensemble manifest (core/nn/ensemble.h) loads every member, runs each
// batch through every member and combines their posteriors as a mixture. The covariance is then
// multiplied by the calibration factors (the checkpoint's, or for an ensemble the manifest's) and
// mapped to physical units.
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
#include "core/nn/uncertainty.h"

namespace cosmoflow {

struct ModelOptions {
  int max_batch = 4;
  Precision precision = Precision::kFp32;
  KernelSelection kernel_selection = KernelSelection::kRule;  // NetworkOptions's
  std::string kernel_cache;
};

class Model {
 public:
  // `path` is a checkpoint file, a directory whose newest valid checkpoint is taken
  // (FindLatestCheckpoint), or an ensemble manifest (a .json file, or a directory holding
  // ensemble.json; FindEnsembleManifest).
  static StatusOr<std::shared_ptr<Model>> Load(const std::string& path,
                                               const ModelOptions& options);

  // Member 0's spec and checkpoint (every member has the same spec); weights are not kept.
  const ModelSpec& spec() const { return checkpoint_.spec; }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const std::string& path() const { return path_; }  // the checkpoint file or the manifest
  // The checkpoint's checksum, or for an ensemble the CRC-32C over its members' and calibration.
  const std::string& checksum() const { return checksum_; }
  const std::string& version() const { return version_; }  // "<spec>-<step>-<checksum>"
  int ensemble_members() const { return int(members_.size()); }
  bool is_ensemble() const { return is_ensemble_; }
  const std::vector<std::string>& member_paths() const { return member_paths_; }
  // Whether Forward() gives a covariance: a head, or an ensemble of two or more members.
  bool has_uncertainty() const;
  // "none" | "gaussian" | "ensemble" (ModelInfo.uncertainty).
  std::string uncertainty_method() const;
  const Calibration& calibration() const { return calibration_; }
  const ModelOptions& options() const { return options_; }
  double load_seconds() const { return load_seconds_; }
  // Time of one warm batch-1 forward pass, measured at load.
  double forward1_seconds() const { return forward1_seconds_; }
  double loaded_at_unix_seconds() const { return loaded_at_unix_seconds_; }
  int64_t input_elements() const;  // per cube: C * side^3
  int num_outputs() const { return int(checkpoint_.spec.outputs.size()); }

  // Runs every member's networks for n (1..max_batch) on the same n transformed cubes and writes
  // the n x P posterior means in physical units, and, when has_uncertainty() and
  // physical_cov != nullptr, the n x P x P covariances (calibrated, physical units).
  void Forward(int n, const float* src, float* physical_dst, double* physical_cov = nullptr);

 private:
  struct Member {
    std::vector<std::unique_ptr<Network>> networks;  // largest batch first
  };
  Model() = default;
  Status BuildMember(const Checkpoint& ckpt, const std::string& file);
  void RunMember(Member& member, int n, const float* src);

  Checkpoint checkpoint_;
  std::string path_;
  std::string checksum_;
  std::string version_;
  bool is_ensemble_ = false;
  std::vector<std::string> member_paths_;
  Calibration calibration_;
  ModelOptions options_;
  double load_seconds_ = 0;
  double forward1_seconds_ = 0;
  double loaded_at_unix_seconds_ = 0;
  std::vector<Member> members_;
  std::vector<float> raw_;       // max_batch x head width scratch (one member's outputs)
  std::vector<double> means_;    // max_batch x members x P
  std::vector<double> covs_;     // max_batch x members x P x P
  std::vector<double> mix_;      // one cube's combined mean (P) and covariance (P x P)
};

// "<spec name>-<step, 9 digits>-<checksum>": the model version reported to clients (for an
// ensemble: member 0's spec and step, the ensemble's checksum).
std::string ModelVersion(const Checkpoint& checkpoint, const std::string& checksum);
std::string ModelVersion(const Checkpoint& checkpoint);

}  // namespace cosmoflow
