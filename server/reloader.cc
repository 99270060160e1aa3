#include "server/reloader.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "core/base/log.h"
#include "core/nn/ensemble.h"

namespace cosmoflow {

ModelReloader::ModelReloader(ReloaderOptions options, Batcher* batcher, Metrics* metrics)
    : options_(std::move(options)), batcher_(batcher), metrics_(metrics) {
  thread_ = std::thread([this] { Loop(); });
}

ModelReloader::~ModelReloader() { Stop(); }

Status ModelReloader::LoadInitial() {
  // The watch starts once a model is installed; it must then see the LATEST that this load
  // served, not an empty one (which would reload the same checkpoint again).
  std::lock_guard<std::mutex> lock(load_mu_);
  auto model = ReloadLocked(options_.checkpoint, nullptr);
  if (!model.ok()) return model.status();
  last_latest_ = ReadLatestPointer();
  return Status::Ok();
}

StatusOr<std::shared_ptr<Model>> ModelReloader::Reload(const std::string& path, bool* changed) {
  std::lock_guard<std::mutex> lock(load_mu_);
  return ReloadLocked(path, changed);
}

StatusOr<std::shared_ptr<Model>> ModelReloader::ReloadLocked(const std::string& path,
                                                             bool* changed) {
  const std::string& target = path.empty() ? options_.checkpoint : path;
  if (changed) *changed = false;
  std::shared_ptr<Model> current = batcher_->model();
  auto model = Model::Load(target, options_.model);
  if (!model.ok()) {
    if (current) {  // the first load is not a reload
      metrics_->RecordReload(false);
      CF_LOG(WARNING) << "reload refused, still serving " << current->version() << ": "
                      << model.status().message();
    }
    return model.status();
  }
  if (current && current->version() == (*model)->version() && current->path() == (*model)->path()) {
    metrics_->RecordReload(true);
    return current;  // same checkpoint: keep the warm one
  }
  Install(*model);
  if (current) {
    metrics_->RecordReload(true);
    CF_LOG(INFO) << "now serving " << (*model)->version() << " (was " << current->version() << ")";
  }
  if (changed) *changed = true;
  return *model;
}

void ModelReloader::Install(std::shared_ptr<Model> model) {
  metrics_->SetModel(model->version(), model->spec().name, model->checksum(),
                     model->load_seconds(), model->loaded_at_unix_seconds());
  batcher_->SetModel(std::move(model));
}

void ModelReloader::ReloadAsync(const std::string& path, Done done) {
  std::unique_lock<std::mutex> lock(tasks_mu_);
  if (stopping_) {
    lock.unlock();
    done(UnavailableError("the server is shutting down"), false);
    return;
  }
  tasks_.push_back([this, path, done = std::move(done)] {
    bool changed = false;
    auto model = Reload(path, &changed);
    done(model, changed);
  });
  tasks_cv_.notify_one();
}

std::string ModelReloader::ReadLatestPointer() const {
  // An ensemble is watched by its manifest's content: the trainer rewrites it atomically.
  if (const std::string manifest = FindEnsembleManifest(options_.checkpoint); !manifest.empty()) {
    std::ifstream in(manifest);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  struct stat st;
  if (::stat(options_.checkpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  std::ifstream in(options_.checkpoint + "/LATEST");
  std::string name;
  std::getline(in, name);
  return name;
}

void ModelReloader::Loop() {
  const auto interval = options_.watch_interval.count() > 0 ? options_.watch_interval
                                                            : std::chrono::milliseconds(200);
  std::unique_lock<std::mutex> lock(tasks_mu_);
  for (;;) {
    tasks_cv_.wait_for(lock, interval, [&] { return stopping_ || !tasks_.empty(); });
    while (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
    if (stopping_) break;
    if (!batcher_->model()) continue;  // the initial load has not happened yet
    lock.unlock();
    WatchOnce();
    lock.lock();
  }
}

void ModelReloader::WatchOnce() {
  std::lock_guard<std::mutex> lock(load_mu_);
  if (reload_requested_.exchange(false)) {
    CF_LOG(INFO) << "reload requested (SIGHUP): " << options_.checkpoint;
    (void)ReloadLocked("", nullptr);
    last_latest_ = ReadLatestPointer();
  } else if (options_.watch_interval.count() > 0) {
    std::string latest = ReadLatestPointer();
    if (!latest.empty() && latest != last_latest_) {
      CF_LOG(INFO) << "LATEST in " << options_.checkpoint << " now names " << latest
                   << ": reloading";
      last_latest_ = latest;  // a bad checkpoint is tried once, not every interval
      (void)ReloadLocked("", nullptr);
    }
  }
}

void ModelReloader::Stop() {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    stopping_ = true;
  }
  tasks_cv_.notify_all();
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

}  // namespace cosmoflow
