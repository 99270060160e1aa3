#include "trainer/optimizer.h"

#include <cmath>
#include <map>

namespace cosmoflow {
namespace {

// State tensors with the parameters' names and shapes, plus a lookup by name for LoadState.
struct StateSet {
  std::vector<NamedTensor> tensors;
  void Add(const std::string& prefix, const std::vector<Parameter>& params) {
    for (const Parameter& p : params) {
      tensors.push_back({prefix + p.name, p.shape, std::vector<float>(p.numel(), 0.f)});
    }
  }
};

Status LoadInto(std::vector<NamedTensor>& dst, const std::vector<NamedTensor>& src) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const auto& t : src) by_name[t.name] = &t;
  for (auto& t : dst) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) return InvalidArgumentError("optimizer state lacks tensor '" + t.name + "'");
    if (it->second->shape != t.shape || it->second->data.size() != t.data.size()) {
      return InvalidArgumentError("optimizer state tensor '" + t.name + "' has the wrong shape");
    }
    t.data = it->second->data;
  }
  return Status::Ok();
}

class Sgd final : public TrainerOptimizer {
 public:
  Sgd(TrainerOptimizerConfig c, const std::vector<Parameter>& params) : TrainerOptimizer(std::move(c)) {
    velocity_.Add("sgd.momentum.", params);
  }
  void Step(std::vector<Parameter>& params, double lr) override {
    const float mu = static_cast<float>(config_.momentum), wd = static_cast<float>(config_.weight_decay);
    const float step = static_cast<float>(lr);
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter& p = params[i];
      float* v = velocity_.tensors[i].data.data();
      const int64_t n = p.numel();
      for (int64_t j = 0; j < n; ++j) {
        const float g = p.grad[j] + wd * p.value[j];
        v[j] = mu * v[j] + g;
        p.value[j] -= step * v[j];
      }
    }
  }
  std::vector<NamedTensor> ExportState() const override { return velocity_.tensors; }
  Status LoadState(const std::vector<NamedTensor>& state) override {
    return LoadInto(velocity_.tensors, state);
  }

 private:
  StateSet velocity_;
};

class Adam final : public TrainerOptimizer {
 public:
  Adam(TrainerOptimizerConfig c, const std::vector<Parameter>& params) : TrainerOptimizer(std::move(c)) {
    m_.Add("adam.m.", params);
    v_.Add("adam.v.", params);
  }
  void Step(std::vector<Parameter>& params, double lr) override {
    ++t_;
    const double b1 = config_.beta1, b2 = config_.beta2;
    const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(b1, static_cast<double>(t_))));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(b2, static_cast<double>(t_))));
    const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
    const float eps = static_cast<float>(config_.epsilon), wd = static_cast<float>(config_.weight_decay);
    const float step = static_cast<float>(lr);
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter& p = params[i];
      float* m = m_.tensors[i].data.data();
      float* v = v_.tensors[i].data.data();
      const int64_t n = p.numel();
      for (int64_t j = 0; j < n; ++j) {
        const float g = p.grad[j] + wd * p.value[j];
        m[j] = fb1 * m[j] + (1.f - fb1) * g;
        v[j] = fb2 * v[j] + (1.f - fb2) * g * g;
        p.value[j] -= step * (m[j] * c1) / (std::sqrt(v[j] * c2) + eps);
      }
    }
  }
  std::vector<NamedTensor> ExportState() const override {
    std::vector<NamedTensor> out = m_.tensors;
    out.insert(out.end(), v_.tensors.begin(), v_.tensors.end());
    out.push_back({"adam.t", {1}, {static_cast<float>(t_)}});
    return out;
  }
  Status LoadState(const std::vector<NamedTensor>& state) override {
    CF_RETURN_IF_ERROR(LoadInto(m_.tensors, state));
    CF_RETURN_IF_ERROR(LoadInto(v_.tensors, state));
    for (const auto& t : state) {
      if (t.name == "adam.t" && t.data.size() == 1) {
        t_ = static_cast<int64_t>(t.data[0]);
        return Status::Ok();
      }
    }
    return InvalidArgumentError("optimizer state lacks tensor 'adam.t'");
  }

 private:
  StateSet m_, v_;
  int64_t t_ = 0;  // exact as a float up to 2^24 steps
};

}  // namespace

StatusOr<std::unique_ptr<TrainerOptimizer>> TrainerOptimizer::Create(const TrainerOptimizerConfig& config,
                                                       const std::vector<Parameter>& params) {
  if (config.name == "sgd") return std::unique_ptr<TrainerOptimizer>(new Sgd(config, params));
  if (config.name == "adam") return std::unique_ptr<TrainerOptimizer>(new Adam(config, params));
  return InvalidArgumentError("unknown optimizer '" + config.name + "' (expected sgd or adam)");
}

}  // namespace cosmoflow
