// Which samples each rank trains on at each step: sharding with a per-epoch reshuffle from a seed.
//
// Every epoch has steps_per_epoch() = floor(N / global_batch) steps (the remainder is dropped, as
// in the CosmoFlow reference). Two modes:
// - kGlobal: one permutation of all N samples per epoch (same on every rank, from (seed, epoch));
//   step s of the epoch uses positions [s*G, (s+1)*G) and rank r takes the r-th local_batch slice.
//   So R ranks x batch b see exactly the samples of 1 rank x batch R*b (the equivalence the tests
//   check), and the order is independent of how many ranks there are.
// - kShard: rank r owns a fixed contiguous block of the dataset (what it stages locally) and
//   permutes only its block each epoch; this is the paper's I/O layout (no rank reads another's
//   files), at the price of a less global shuffle.
// Deterministic and portable: the permutation is Fisher-Yates driven by SplitMix64, not
// std::shuffle.
#pragma once

#include <cstdint>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

enum class ShuffleMode { kGlobal, kShard };

// SplitMix64: tiny, well-mixed, portable; used wherever the trainer derives a random stream.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// A well-mixed 64-bit value from a few integers (seed, epoch, index, ...).
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

class EpochSampler {
 public:
  // Fails when the dataset cannot fill one global batch (per rank block in kShard mode).
  static StatusOr<EpochSampler> Create(int64_t num_samples, int world_size, int rank,
                                       int local_batch, uint64_t seed, ShuffleMode mode);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int global_batch() const { return local_batch_ * world_size_; }
  int local_batch() const { return local_batch_; }

  // Global sample indices of this rank's local batch at step `step_in_epoch` of `epoch`.
  // Cost: one O(N) permutation per new epoch (cached), then O(local_batch).
  std::vector<int64_t> LocalBatch(int64_t epoch, int64_t step_in_epoch);
  // Every sample index this rank may ever read (what staging loads), sorted.
  std::vector<int64_t> SamplesOfThisRank() const;

 private:
  EpochSampler() = default;
  void EnsureEpoch(int64_t epoch);

  int64_t num_samples_ = 0;
  int world_size_ = 1;
  int rank_ = 0;
  int local_batch_ = 1;
  uint64_t seed_ = 0;
  ShuffleMode mode_ = ShuffleMode::kGlobal;
  int64_t steps_per_epoch_ = 0;
  int64_t block_begin_ = 0, block_size_ = 0;  // kShard: this rank's block
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace cosmoflow
