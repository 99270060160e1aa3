// The prefetching input pipeline: a background thread reads cubes (from HDF5 or from memory),
// applies an optional random cube symmetry and periodic shift, the model's input transform and the label
// normalisation, and fills batches into a bounded queue, so the training loop never waits on HDF5.
//
// Memory is bounded and allocated once: queue_depth + 1 batch buffers are recycled.
// What a batch holds is fixed by a BatchPlan (which sample indices make batch k), so the stream is
// deterministic whatever the timing: the symmetry and shift of a sample are hashes of (seed, epoch,
// index).
// Thread-safety: Next()/Release() are called from one consumer thread (the training loop).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/base/status.h"
#include "core/io/dataset.h"
#include "core/nn/spec.h"

namespace cosmoflow {

// Where cubes come from: the dataset on disk or a copy staged in memory.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual const DatasetInfo& info() const = 0;
  virtual int64_t size() const = 0;
  virtual Status ReadCube(int64_t index, int16_t* dst) const = 0;  // info().shape.elements()
  virtual Status ReadParams(int64_t index, float* dst) const = 0;  // info().param_names.size()
};

// Reads straight from the HDF5 dataset (which must outlive the source).
std::unique_ptr<SampleSource> MakeDatasetSource(const Dataset* dataset);
// Reads `indices` of the dataset into memory now (the paper's staging lesson: read the shared
// file system once, then train from local memory). Other indices are an OutOfRange error later.
StatusOr<std::unique_ptr<SampleSource>> StageInMemory(const Dataset& dataset,
                                                      const std::vector<int64_t>& indices);

// How the dataset's parameters map onto the network outputs: out[k] = (param[column[k]] -
// offset[k]) / scale[k]. Matching is by name (case-insensitive); the error lists both name sets.
struct LabelMap {
  std::vector<int> column;
  std::vector<float> offset, scale;
};
StatusOr<LabelMap> MakeLabelMap(const ModelSpec& spec, const DatasetInfo& info,
                                const std::string& what);

struct BatchPlan {
  int64_t num_batches = 0;
  // Sample indices of batch k (exactly `batch` of them; repeat the last one to pad) and the epoch
  // used for augmentation.
  std::function<std::vector<int64_t>(int64_t k)> indices;
  std::function<int64_t(int64_t k)> epoch;
  // Number of real (not padding) samples in batch k; default all.
  std::function<int(int64_t k)> valid;
};

struct PrefetchConfig {
  int batch = 1;
  int queue_depth = 2;
  bool augment = false;        // a random one of the 48 cube symmetries per sample
  bool augment_shift = false;  // then a random periodic shift (whole periodic boxes only)
  uint64_t seed = 0;
  InputTransform transform = InputTransform::kLog1p;
  LabelMap labels;
};

struct PrefetchedBatch {
  int64_t number = 0;            // k in the plan
  std::vector<int64_t> indices;  // dataset sample indices
  int valid = 0;
  std::vector<float> src;       // batch x C x D x H x W, transformed
  std::vector<float> labels;    // batch x P, normalised
  std::vector<float> physical;  // batch x P, the dataset's values (for relative errors)
  Status status;                // a read error for this batch (then the data is undefined)
};

class PrefetchLoader {
 public:
  // `source` must outlive the loader. Starts the producer thread at once.
  PrefetchLoader(const SampleSource* source, BatchPlan plan, PrefetchConfig config);
  ~PrefetchLoader();  // stops and joins the producer
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // The next batch in plan order, or nullptr after the last. Adds the time spent blocked to *wait.
  const PrefetchedBatch* Next(double* wait_seconds);
  // Returns a batch's buffer to the pool; call before the next Next() that would need it.
  void Release(const PrefetchedBatch* batch);

 private:
  void Produce();
  // The sample in scratch[0] after the configured augmentations (scratch[1], [2] hold the rotated
  // and the shifted copies): a pointer into scratch. Non-cubic samples are never augmented.
  const int16_t* Augment(std::vector<int16_t>* scratch, int64_t epoch, int64_t index) const;
  // scratch holds three cubes of counts: as read, rotated, shifted.
  void Fill(PrefetchedBatch* batch, int64_t k, std::vector<int16_t>* scratch);

  const SampleSource* source_;
  BatchPlan plan_;
  PrefetchConfig config_;
  std::vector<std::unique_ptr<PrefetchedBatch>> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PrefetchedBatch*> free_, ready_;
  bool stop_ = false;
  int64_t produced_ = 0;
  std::thread thread_;
};

}  // namespace cosmoflow
