#include "synth/generator_pool.h"

namespace cosmoflow {
namespace synth {

StatusOr<std::unique_ptr<GeneratorPool>> GeneratorPool::Create(
    const UniverseOptions& options, int workers, const ParamRanges& ranges,
    const CosmologyParams& base, uint64_t seed, int64_t first_index, int64_t count) {
  if (workers < 1 || workers > 256) {
    return InvalidArgumentError("generator workers = " + std::to_string(workers) +
                                ": must be in 1..256");
  }
  if (count < 0 || first_index < 0) {
    return InvalidArgumentError("generator: negative sample count or first index");
  }
  CF_RETURN_IF_ERROR(ranges.Validate());
  std::unique_ptr<GeneratorPool> pool(new GeneratorPool());
  pool->ranges_ = ranges;
  pool->base_ = base;
  pool->transfer_ = options.transfer;
  pool->seed_ = seed;
  pool->first_index_ = first_index;
  pool->count_ = count;
  const int used = static_cast<int>(std::min<int64_t>(workers, std::max<int64_t>(count, 1)));
  for (int w = 0; w < used; ++w) {
    CF_ASSIGN_OR_RETURN(auto g, UniverseGenerator::Create(options));
    pool->generators_.push_back(std::move(g));
  }
  for (int w = 0; w < used; ++w) pool->threads_.emplace_back(&GeneratorPool::Work, pool.get(), w);
  return pool;
}

GeneratorPool::~GeneratorPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void GeneratorPool::Work(int worker) {
  const int workers = static_cast<int>(generators_.size());
  for (int64_t n = worker; n < count_; n += workers) {
    {
      // Stay at most two rounds ahead of the consumer: bounded memory.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || n < next_ + 2 * workers; });
      if (stop_) return;
    }
    GeneratedSample s;
    s.index = first_index_ + n;
    s.params = DrawParams(ranges_, seed_, static_cast<uint64_t>(s.index), base_);
    Status status;
    auto cosmology = Cosmology::Create(s.params, transfer_);
    if (!cosmology.ok()) {
      status = cosmology.status().WithContext("sample " + std::to_string(s.index));
    } else {
      auto cube = generators_[worker]->Generate(*cosmology, seed_, static_cast<uint64_t>(s.index));
      if (cube.ok()) {
        s.cube = std::move(cube).value();
      } else {
        status = cube.status();
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!status.ok()) {
      if (error_.ok()) error_ = status;
      stop_ = true;
      cv_.notify_all();
      return;
    }
    ready_.emplace(n, std::move(s));
    cv_.notify_all();
  }
}

StatusOr<GeneratedSample> GeneratorPool::Next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (next_ >= count_) return OutOfRangeError("generator: all samples handed out");
  cv_.wait(lock, [&] { return !error_.ok() || ready_.count(next_) > 0; });
  if (!error_.ok()) return error_;
  auto it = ready_.find(next_);
  GeneratedSample s = std::move(it->second);
  ready_.erase(it);
  ++next_;
  cv_.notify_all();
  return s;
}

}  // namespace synth
}  // namespace cosmoflow
