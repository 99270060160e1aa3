// Generates a run of samples on several worker threads, each with its own UniverseGenerator, and
// hands them out in index order. Workers use one thread per cube by default: independent samples
// need no synchronisation, which scales better than threads inside one cube (whose loops end in
// barriers that stall whenever a core is taken by other work).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/base/status.h"
#include "core/io/cube.h"
#include "synth/universe.h"

namespace cosmoflow {
namespace synth {

struct GeneratedSample {
  int64_t index = 0;
  CosmologyParams params;
  Cube cube;
};

class GeneratorPool {
 public:
  // Samples first_index .. first_index + count - 1 of `seed`, parameters drawn from `ranges`
  // around `base`. `options.threads` is the thread count per cube; `workers` >= 1.
  static StatusOr<std::unique_ptr<GeneratorPool>> Create(const UniverseOptions& options,
                                                         int workers, const ParamRanges& ranges,
                                                         const CosmologyParams& base, uint64_t seed,
                                                         int64_t first_index, int64_t count);
  ~GeneratorPool();  // stops the workers and joins them

  // The next sample in index order; blocks until it is ready. The first error of any worker is
  // returned (naming the sample) and ends the run. OUT_OF_RANGE after the last sample.
  StatusOr<GeneratedSample> Next();

 private:
  GeneratorPool() = default;
  void Work(int worker);

  std::vector<std::unique_ptr<UniverseGenerator>> generators_;
  std::vector<std::thread> threads_;
  ParamRanges ranges_;
  CosmologyParams base_;
  TransferFunction transfer_ = TransferFunction::kEisensteinHu;
  uint64_t seed_ = 0;
  int64_t first_index_ = 0, count_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, GeneratedSample> ready_;  // by position n = index - first_index
  int64_t next_ = 0;                          // next position to hand out
  bool stop_ = false;
  Status error_;
};

}  // namespace synth
}  // namespace cosmoflow
