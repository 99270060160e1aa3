#include "trainer/sampler.h"

#include <numeric>
#include <string>

namespace cosmoflow {

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t state = a;
  uint64_t h = SplitMix64(state);
  state ^= b * 0xd1342543de82ef95ull;
  h ^= SplitMix64(state);
  state ^= c * 0xaf251af3b0f025b5ull;
  h ^= SplitMix64(state);
  state ^= d * 0x9e3779b97f4a7c15ull;
  h ^= SplitMix64(state);
  return h;
}

StatusOr<EpochSampler> EpochSampler::Create(int64_t num_samples, int world_size, int rank,
                                            int local_batch, uint64_t seed, ShuffleMode mode) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgumentError("sampler: bad rank " + std::to_string(rank) + " of " +
                                std::to_string(world_size));
  }
  if (local_batch < 1) return InvalidArgumentError("sampler: batch must be >= 1");
  EpochSampler s;
  s.num_samples_ = num_samples;
  s.world_size_ = world_size;
  s.rank_ = rank;
  s.local_batch_ = local_batch;
  s.seed_ = seed;
  s.mode_ = mode;
  const int64_t global = int64_t{local_batch} * world_size;
  if (mode == ShuffleMode::kGlobal) {
    s.block_begin_ = 0;
    s.block_size_ = num_samples;
    s.steps_per_epoch_ = num_samples / global;
  } else {
    // Blocks of floor or ceil(N / R); every rank runs the same number of steps (the smallest
    // block).
    s.block_begin_ = num_samples * rank / world_size;
    s.block_size_ = num_samples * (rank + 1) / world_size - s.block_begin_;
    s.steps_per_epoch_ = (num_samples / world_size) / local_batch;
  }
  if (s.steps_per_epoch_ < 1) {
    return InvalidArgumentError("dataset has " + std::to_string(num_samples) +
                                " samples, fewer than one global batch of " +
                                std::to_string(global) + " (" + std::to_string(world_size) +
                                " ranks x batch " + std::to_string(local_batch) + ")");
  }
  return s;
}

void EpochSampler::EnsureEpoch(int64_t epoch) {
  if (epoch == cached_epoch_) return;
  perm_.resize(block_size_);
  std::iota(perm_.begin(), perm_.end(), block_begin_);
  // The shard mode mixes the rank in so that blocks are not permuted in lockstep.
  uint64_t state = MixSeed(seed_, static_cast<uint64_t>(epoch),
                           mode_ == ShuffleMode::kShard ? static_cast<uint64_t>(rank_) + 1 : 0);
  for (int64_t i = block_size_ - 1; i > 0; --i) {
    // Multiply-shift maps 64 random bits to [0, i] without modulo bias worth caring about here.
    const uint64_t r = SplitMix64(state);
    const int64_t j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm_[i], perm_[j]);
  }
  cached_epoch_ = epoch;
}

std::vector<int64_t> EpochSampler::LocalBatch(int64_t epoch, int64_t step_in_epoch) {
  EnsureEpoch(epoch);
  std::vector<int64_t> out(local_batch_);
  int64_t first = mode_ == ShuffleMode::kGlobal
                      ? step_in_epoch * global_batch() + int64_t{rank_} * local_batch_
                      : step_in_epoch * local_batch_;
  for (int i = 0; i < local_batch_; ++i) out[i] = perm_[first + i];
  return out;
}

std::vector<int64_t> EpochSampler::SamplesOfThisRank() const {
  std::vector<int64_t> out(block_size_);
  std::iota(out.begin(), out.end(), block_begin_);
  return out;
}

}  // namespace cosmoflow
