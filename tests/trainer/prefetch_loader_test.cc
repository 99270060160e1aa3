#include "trainer/prefetch_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>

#include "trainer/sampler.h"

namespace cosmoflow {
namespace {

class PrefetchLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cf-loader-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/train.h5";
    DatasetInfo info;
    info.shape = {1, 4, 4, 4};
    info.param_names = {"sigma_8", "Omega_M", "n_s"};  // deliberately not the spec's order
    info.param_units = {"", "", ""};
    info.redshifts = {0.0};  // DatasetWriter fails on an empty list (reported)
    info.generator = "prefetch_loader_test";
    auto w = DatasetWriter::Create(path_, info);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (int i = 0; i < kN; ++i) {
      Cube c(info.shape, DType::kInt16);
      for (int k = 0; k < 64; ++k) c.int16_data()[k] = static_cast<int16_t>(i * 100 + k);
      ASSERT_TRUE((*w)->Append(c, {0.8f + 0.01f * i, 0.3f, 0.95f}).ok());
    }
    ASSERT_TRUE((*w)->Close().ok());
    auto ds = Dataset::Open(path_);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    dataset_ = std::move(ds).value();
    spec_.name = "test";
    spec_.outputs = CosmoFlowOutputs(3);  // Omega_M, sigma_8, n_s
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  PrefetchConfig Config(bool augment, bool shift = false) {
    PrefetchConfig c;
    c.batch = 2;
    c.queue_depth = 2;
    c.augment = augment;
    c.augment_shift = shift;
    c.seed = 3;
    c.transform = InputTransform::kLog1p;
    auto labels = MakeLabelMap(spec_, dataset_->info(), "test");
    EXPECT_TRUE(labels.ok()) << labels.status().ToString();
    c.labels = *labels;
    return c;
  }
  BatchPlan Plan() {
    BatchPlan p;
    p.num_batches = 4;
    p.indices = [](int64_t k) { return std::vector<int64_t>{(2 * k + 1) % kN, (2 * k) % kN}; };
    p.epoch = [](int64_t) { return 0; };
    return p;
  }

  static constexpr int kN = 6;
  std::string dir_, path_;
  std::unique_ptr<Dataset> dataset_;
  ModelSpec spec_;
};

TEST_F(PrefetchLoaderTest, BatchesArriveInPlanOrderTransformedAndNormalised) {
  auto source = MakeDatasetSource(dataset_.get());
  PrefetchLoader loader(source.get(), Plan(), Config(false));
  for (int k = 0; k < 4; ++k) {
    double wait = 0;
    const PrefetchedBatch* b = loader.Next(&wait);
    ASSERT_NE(b, nullptr);
    ASSERT_TRUE(b->status.ok()) << b->status.ToString();
    EXPECT_EQ(b->number, k);
    const int64_t first = (2 * k + 1) % kN;
    EXPECT_EQ(b->indices[0], first);
    EXPECT_FLOAT_EQ(b->src[5], std::log1p(static_cast<float>(first * 100 + 5)));
    // Output 0 is Omega_M = 0.3 -> (0.3 - 0.30) / 0.05 = 0; output 1 is sigma_8 from column 0.
    EXPECT_NEAR(b->labels[0], 0.0f, 1e-5);
    EXPECT_NEAR(b->labels[1], (0.8f + 0.01f * first - 0.865f) / 0.085f, 1e-5);
    EXPECT_NEAR(b->physical[1], 0.8f + 0.01f * first, 1e-6);
    loader.Release(b);
  }
  EXPECT_EQ(loader.Next(nullptr), nullptr);
}

TEST_F(PrefetchLoaderTest, AugmentationPermutesVoxelsDeterministically) {
  auto source = MakeDatasetSource(dataset_.get());
  PrefetchLoader plain(source.get(), Plan(), Config(false));
  PrefetchLoader a1(source.get(), Plan(), Config(true));
  PrefetchLoader a2(source.get(), Plan(), Config(true));
  int changed = 0;
  for (int k = 0; k < 4; ++k) {
    const PrefetchedBatch* p = plain.Next(nullptr);
    const PrefetchedBatch* x = a1.Next(nullptr);
    const PrefetchedBatch* y = a2.Next(nullptr);
    EXPECT_EQ(x->src, y->src);  // same seed, same symmetries
    std::vector<float> ps(p->src), xs(x->src);
    if (ps != xs) ++changed;
    std::sort(ps.begin(), ps.end());
    std::sort(xs.begin(), xs.end());
    EXPECT_EQ(ps, xs);  // a symmetry only moves voxels
    EXPECT_EQ(p->labels, x->labels);
    plain.Release(p);
    a1.Release(x);
    a2.Release(y);
  }
  EXPECT_GT(changed, 0);
}

// With --augment-shift each sample is a periodic translation of what --augment alone gives; the
// translation varies between samples and is the same on every run.
TEST_F(PrefetchLoaderTest, PeriodicShiftTranslatesTheRotatedSampleDeterministically) {
  auto source = MakeDatasetSource(dataset_.get());
  PrefetchLoader rotated(source.get(), Plan(), Config(true));
  PrefetchLoader s1(source.get(), Plan(), Config(true, true));
  PrefetchLoader s2(source.get(), Plan(), Config(true, true));
  std::set<int> shifts_seen;
  for (int k = 0; k < 4; ++k) {
    const PrefetchedBatch* r = rotated.Next(nullptr);
    const PrefetchedBatch* x = s1.Next(nullptr);
    const PrefetchedBatch* y = s2.Next(nullptr);
    EXPECT_EQ(x->src, y->src);
    EXPECT_EQ(r->labels, x->labels);
    for (int i = 0; i < 2; ++i) {
      const float* a = r->src.data() + i * 64;
      const float* b = x->src.data() + i * 64;
      int found = -1;  // the shift s (z, y, x in base 4) with b[v] = a[v shifted by s]
      for (int s = 0; s < 64 && found < 0; ++s) {
        const int sz = s / 16, sy = s / 4 % 4, sx = s % 4;
        bool match = true;
        for (int v = 0; v < 64 && match; ++v) {
          const int z = v / 16, yy = v / 4 % 4, xx = v % 4;
          match = b[v] == a[((z + sz) % 4 * 4 + (yy + sy) % 4) * 4 + (xx + sx) % 4];
        }
        if (match) found = s;
      }
      ASSERT_GE(found, 0) << "batch " << k << " sample " << i << " is no periodic shift";
      shifts_seen.insert(found);
    }
    rotated.Release(r);
    s1.Release(x);
    s2.Release(y);
  }
  EXPECT_GT(shifts_seen.size(), 1u);  // not one fixed shift for all
}

TEST_F(PrefetchLoaderTest, MemoryStagingGivesTheSameBatchesAndRefusesUnstagedSamples) {
  auto disk = MakeDatasetSource(dataset_.get());
  auto all = StageInMemory(*dataset_, {0, 1, 2, 3, 4, 5});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  PrefetchLoader a(disk.get(), Plan(), Config(false)), b(all->get(), Plan(), Config(false));
  for (int k = 0; k < 4; ++k) {
    const PrefetchedBatch* x = a.Next(nullptr);
    const PrefetchedBatch* y = b.Next(nullptr);
    EXPECT_EQ(x->src, y->src);
    EXPECT_EQ(x->labels, y->labels);
    a.Release(x);
    b.Release(y);
  }
  auto part = StageInMemory(*dataset_, {0, 2});
  ASSERT_TRUE(part.ok());
  PrefetchLoader c(part->get(), Plan(), Config(false));
  const PrefetchedBatch* x = c.Next(nullptr);  // needs sample 1
  ASSERT_NE(x, nullptr);
  EXPECT_FALSE(x->status.ok());
  EXPECT_NE(x->status.message().find("not staged"), std::string::npos);
  c.Release(x);
}

TEST_F(PrefetchLoaderTest, MissingParameterNamesAreAnError) {
  ModelSpec spec = spec_;
  spec.outputs = CosmoFlowOutputs(4);  // wants H0 too
  auto m = MakeLabelMap(spec, dataset_->info(), "--train x.h5");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("lack the model output 'H0'"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("--train x.h5"), std::string::npos);
}

// Serves another source's samples and holds every cube read from the `hold_from`-th on until
// Open(), so a test can tell what the reader did before the consumer asked.
class GatedSource final : public SampleSource {
 public:
  GatedSource(const SampleSource* inner, int hold_from) : inner_(inner), hold_from_(hold_from) {}
  const DatasetInfo& info() const override { return inner_->info(); }
  int64_t size() const override { return inner_->size(); }
  Status ReadCube(int64_t index, int16_t* dst) const override {
    std::unique_lock<std::mutex> lock(mu_);
    if (reads_++ >= hold_from_) {
      held_ = true;
      cv_.notify_all();
      // Bounded, so that a broken loader fails the test instead of hanging it.
      cv_.wait_for(lock, std::chrono::seconds(60), [&] { return open_; });
    }
    lock.unlock();
    return inner_->ReadCube(index, dst);
  }
  Status ReadParams(int64_t index, float* dst) const override {
    return inner_->ReadParams(index, dst);
  }
  // Waits until a read is being held (up to 60 s); false on timeout.
  bool WaitUntilHeld() const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return held_; });
  }
  bool opened() const {
    std::lock_guard<std::mutex> lock(mu_);
    return open_;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  const SampleSource* inner_;
  const int hold_from_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable int reads_ = 0;
  mutable bool held_ = false;
  bool open_ = false;
};

TEST_F(PrefetchLoaderTest, ReaderRunsAheadOfTheConsumer) {
  auto disk = MakeDatasetSource(dataset_.get());
  // Batches of 2: reads 0-3 are batches 0 and 1; the first read of batch 2 is held.
  GatedSource source(disk.get(), /*hold_from=*/4);
  PrefetchLoader loader(&source, Plan(), Config(false));
  // The reader has finished batches 0 and 1 (it fills a batch before it starts the next) while the
  // consumer has not asked for anything yet.
  ASSERT_TRUE(source.WaitUntilHeld()) << "the reader did not start batch 2 on its own";
  for (int k = 0; k < 2; ++k) {
    const PrefetchedBatch* b = loader.Next(nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->number, k);
    EXPECT_TRUE(b->status.ok()) << b->status.ToString();
    // Served while the reader is still held: the batch was ready, not read on demand.
    EXPECT_FALSE(source.opened());
    loader.Release(b);
  }
  source.Open();
  for (int k = 2; k < 4; ++k) {
    const PrefetchedBatch* b = loader.Next(nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->number, k);
    loader.Release(b);
  }
  EXPECT_EQ(loader.Next(nullptr), nullptr);
}

}  // namespace
}  // namespace cosmoflow
