#include "trainer/prefetch_loader.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

#include "trainer/sampler.h"
#include "trainer/symmetry.h"

namespace cosmoflow {
namespace {

class DatasetSource final : public SampleSource {
 public:
  explicit DatasetSource(const Dataset* dataset) : dataset_(dataset) {}
  const DatasetInfo& info() const override { return dataset_->info(); }
  int64_t size() const override { return dataset_->size(); }
  Status ReadCube(int64_t index, int16_t* dst) const override {
    return dataset_->ReadCubeInto(index, dst);
  }
  Status ReadParams(int64_t index, float* dst) const override {
    CF_ASSIGN_OR_RETURN(std::vector<float> p, dataset_->ReadParams(index));
    std::copy(p.begin(), p.end(), dst);
    return Status::Ok();
  }

 private:
  const Dataset* dataset_;
};

class MemorySource final : public SampleSource {
 public:
  MemorySource(DatasetInfo info, int64_t size) : info_(std::move(info)), size_(size) {}
  const DatasetInfo& info() const override { return info_; }
  int64_t size() const override { return size_; }
  Status ReadCube(int64_t index, int16_t* dst) const override {
    auto it = slot_.find(index);
    if (it == slot_.end()) return NotStaged(index);
    const int64_t n = info_.shape.elements();
    std::memcpy(dst, cubes_.data() + it->second * n, n * sizeof(int16_t));
    return Status::Ok();
  }
  Status ReadParams(int64_t index, float* dst) const override {
    auto it = slot_.find(index);
    if (it == slot_.end()) return NotStaged(index);
    const size_t p = info_.param_names.size();
    std::memcpy(dst, params_.data() + it->second * p, p * sizeof(float));
    return Status::Ok();
  }

  DatasetInfo info_;
  int64_t size_;
  std::unordered_map<int64_t, int64_t> slot_;
  std::vector<int16_t> cubes_;
  std::vector<float> params_;

 private:
  static Status NotStaged(int64_t index) {
    return OutOfRangeError("sample " + std::to_string(index) +
                           " was not staged into memory by this rank");
  }
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::unique_ptr<SampleSource> MakeDatasetSource(const Dataset* dataset) {
  return std::make_unique<DatasetSource>(dataset);
}

StatusOr<std::unique_ptr<SampleSource>> StageInMemory(const Dataset& dataset,
                                                      const std::vector<int64_t>& indices) {
  auto source = std::make_unique<MemorySource>(dataset.info(), dataset.size());
  const int64_t n = dataset.info().shape.elements();
  const size_t p = dataset.info().param_names.size();
  source->cubes_.resize(indices.size() * n);
  source->params_.resize(indices.size() * p);
  for (size_t k = 0; k < indices.size(); ++k) {
    CF_RETURN_IF_ERROR(dataset.ReadCubeInto(indices[k], source->cubes_.data() + k * n));
    CF_ASSIGN_OR_RETURN(std::vector<float> params, dataset.ReadParams(indices[k]));
    std::copy(params.begin(), params.end(), source->params_.begin() + k * p);
    source->slot_[indices[k]] = static_cast<int64_t>(k);
  }
  return std::unique_ptr<SampleSource>(std::move(source));
}

StatusOr<LabelMap> MakeLabelMap(const ModelSpec& spec, const DatasetInfo& info,
                                const std::string& what) {
  LabelMap map;
  std::string have, want;
  for (const auto& n : info.param_names) have += (have.empty() ? "" : ",") + n;
  for (const auto& o : spec.outputs) want += (want.empty() ? "" : ",") + o.name;
  for (const OutputSpec& out : spec.outputs) {
    int found = -1;
    for (size_t j = 0; j < info.param_names.size(); ++j) {
      if (Lower(info.param_names[j]) == Lower(out.name)) found = static_cast<int>(j);
    }
    if (found < 0) {
      return InvalidArgumentError(what + ": dataset parameters [" + have +
                                  "] lack the model output '" + out.name + "' (model outputs [" +
                                  want + "])");
    }
    if (!(out.scale != 0))
      return InvalidArgumentError("model output '" + out.name + "' has scale 0");
    map.column.push_back(found);
    map.offset.push_back(out.offset);
    map.scale.push_back(out.scale);
  }
  return map;
}

PrefetchLoader::PrefetchLoader(const SampleSource* source, BatchPlan plan, PrefetchConfig config)
    : source_(source), plan_(std::move(plan)), config_(std::move(config)) {
  const int64_t elements = source_->info().shape.elements();
  const size_t outputs = config_.labels.column.size();
  const int depth = std::max(1, config_.queue_depth);
  for (int i = 0; i < depth + 1; ++i) {
    auto b = std::make_unique<PrefetchedBatch>();
    b->src.resize(static_cast<size_t>(config_.batch) * elements);
    b->labels.resize(config_.batch * outputs);
    b->physical.resize(config_.batch * outputs);
    free_.push_back(b.get());
    slots_.push_back(std::move(b));
  }
  // queue_depth batches can be ready while the consumer trains on one more.
  thread_ = std::thread([this] { Produce(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

const int16_t* PrefetchLoader::Augment(std::vector<int16_t>* scratch, int64_t epoch,
                                       int64_t index) const {
  const CubeShape shape = source_->info().shape;
  const int16_t* cube = scratch[0].data();
  if (shape.depth != shape.height || shape.height != shape.width) return cube;
  const auto draw = [&](uint64_t salt, uint64_t n) {
    return static_cast<int>(MixSeed(config_.seed, static_cast<uint64_t>(epoch),
                                    static_cast<uint64_t>(index), salt) % n);
  };
  if (config_.augment) {
    ApplyCubeSymmetry(draw(0x5e77, kNumCubeSymmetries), cube, scratch[1].data(), shape.channels,
                      shape.depth);
    cube = scratch[1].data();
  }
  if (config_.augment_shift) {
    const uint64_t side = static_cast<uint64_t>(shape.depth);
    const int shift[3] = {draw(0x5417a, side), draw(0x5417b, side), draw(0x5417c, side)};
    ApplyPeriodicShift(shift, cube, scratch[2].data(), shape.channels, shape.depth);
    cube = scratch[2].data();
  }
  return cube;
}

void PrefetchLoader::Fill(PrefetchedBatch* batch, int64_t k, std::vector<int16_t>* scratch) {
  const DatasetInfo& info = source_->info();
  const CubeShape shape = info.shape;
  const int64_t elements = shape.elements();
  const size_t outputs = config_.labels.column.size();
  std::vector<float> params(info.param_names.size());
  batch->number = k;
  batch->indices = plan_.indices(k);
  batch->valid = plan_.valid ? plan_.valid(k) : config_.batch;
  batch->status = Status::Ok();
  const int64_t epoch = plan_.epoch ? plan_.epoch(k) : 0;
  for (int i = 0; i < config_.batch; ++i) {
    const int64_t index = batch->indices[i];
    Status s = source_->ReadCube(index, scratch[0].data());
    if (s.ok()) s = source_->ReadParams(index, params.data());
    if (!s.ok()) {
      batch->status = s;
      return;
    }
    const int16_t* cube = Augment(scratch, epoch, index);
    ApplyInputTransform(config_.transform, cube, elements, shape.voxels(),
                        batch->src.data() + i * elements);
    for (size_t o = 0; o < outputs; ++o) {
      const float phys = params[config_.labels.column[o]];
      batch->physical[i * outputs + o] = phys;
      batch->labels[i * outputs + o] = (phys - config_.labels.offset[o]) / config_.labels.scale[o];
    }
  }
}

void PrefetchLoader::Produce() {
  const int64_t elements = source_->info().shape.elements();
  std::vector<int16_t> scratch[3] = {std::vector<int16_t>(elements),
                                     std::vector<int16_t>(config_.augment ? elements : 0),
                                     std::vector<int16_t>(config_.augment_shift ? elements : 0)};
  for (int64_t k = 0; k < plan_.num_batches; ++k) {
    PrefetchedBatch* slot = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !free_.empty(); });
      if (stop_) return;
      slot = free_.front();
      free_.pop_front();
    }
    Fill(slot, k, scratch);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(slot);
      ++produced_;
    }
    cv_.notify_all();
  }
}

const PrefetchedBatch* PrefetchLoader::Next(double* wait_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || produced_ == plan_.num_batches; });
  PrefetchedBatch* b = nullptr;
  if (!ready_.empty()) {
    b = ready_.front();
    ready_.pop_front();
  }
  lock.unlock();
  if (wait_seconds) {
    *wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return b;
}

void PrefetchLoader::Release(const PrefetchedBatch* batch) {
  if (!batch) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(const_cast<PrefetchedBatch*>(batch));
  }
  cv_.notify_all();
}

}  // namespace cosmoflow
