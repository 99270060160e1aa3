#include "core/nn/optimizer.h"

#include <cmath>

namespace cosmoflow {
namespace {

bool IsBias(const Parameter& p) { return p.shape.size() == 1; }

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// Common state handling: one or two slots per parameter, named "<opt>.<slot>.<param>".
class OptimizerBase : public Optimizer {
 public:
  OptimizerBase(std::string name, std::vector<std::string> slots, OptimizerConfig c)
      : name_(std::move(name)), slot_names_(std::move(slots)), config_(c) {}
  const std::string& name() const override { return name_; }
  int64_t steps() const override { return steps_; }

  std::vector<NamedTensor> ExportState(const std::vector<Parameter>& params) const override {
    std::vector<NamedTensor> out;
    for (size_t s = 0; s < slot_names_.size(); ++s) {
      for (size_t i = 0; i < params.size(); ++i) {
        NamedTensor t{name_ + "." + slot_names_[s] + "." + params[i].name, params[i].shape, {}};
        if (Sized(params)) {
          t.data = state_[s][i];
        } else {
          t.data.assign(params[i].numel(), 0.f);
        }
        out.push_back(std::move(t));
      }
    }
    out.push_back({name_ + ".step", {1}, {static_cast<float>(steps_)}});
    return out;
  }

  Status RestoreState(const std::vector<Parameter>& params, const std::vector<NamedTensor>& state) override {
    auto find = [&](const std::string& n) -> const NamedTensor* {
      for (const auto& t : state) {
        if (t.name == n) return &t;
      }
      return nullptr;
    };
    std::vector<std::vector<std::vector<float>>> fresh(slot_names_.size());
    for (size_t s = 0; s < slot_names_.size(); ++s) {
      for (const auto& p : params) {
        const std::string n = name_ + "." + slot_names_[s] + "." + p.name;
        const NamedTensor* t = find(n);
        if (t == nullptr) return NotFoundError("optimizer state: missing tensor '" + n + "'");
        if (t->shape != p.shape || static_cast<int64_t>(t->data.size()) != p.numel()) {
          return InvalidArgumentError("optimizer state: tensor '" + n + "' has shape " + ShapeString(t->shape) +
                                      ", parameter has " + ShapeString(p.shape));
        }
        fresh[s].push_back(t->data);
      }
    }
    const NamedTensor* step = find(name_ + ".step");
    if (step == nullptr || step->data.size() != 1 || !(step->data[0] >= 0)) {
      return NotFoundError("optimizer state: missing or bad '" + name_ + ".step'");
    }
    state_ = std::move(fresh);
    steps_ = static_cast<int64_t>(step->data[0]);
    return Status::Ok();
  }

 protected:
  bool Sized(const std::vector<Parameter>& params) const {
    return !state_.empty() && state_[0].size() == params.size();
  }
  void EnsureState(const std::vector<Parameter>& params) {
    if (Sized(params)) return;
    state_.assign(slot_names_.size(), {});
    for (auto& slot : state_) {
      for (const auto& p : params) slot.emplace_back(p.numel(), 0.f);
    }
  }
  std::string name_;
  std::vector<std::string> slot_names_;
  OptimizerConfig config_;
  std::vector<std::vector<std::vector<float>>> state_;  // [slot][param][element]
  int64_t steps_ = 0;
};

class Sgd : public OptimizerBase {
 public:
  explicit Sgd(const OptimizerConfig& c) : OptimizerBase("sgd", {"momentum"}, c) {}
  void Step(std::vector<Parameter>& params, float lr) override {
    EnsureState(params);
    const float mu = config_.momentum, wd = config_.weight_decay;
    const bool nesterov = config_.nesterov;
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter& p = params[i];
      float* v = state_[0][i].data();
      const float decay = IsBias(p) ? 0.f : wd;
      const int64_t n = p.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t j = 0; j < n; ++j) {
        const float g = p.grad[j] + decay * p.value[j];
        v[j] = mu * v[j] + g;
        p.value[j] -= lr * (nesterov ? g + mu * v[j] : v[j]);
      }
    }
    ++steps_;
  }
};

class Adam : public OptimizerBase {
 public:
  explicit Adam(const OptimizerConfig& c) : OptimizerBase("adam", {"m", "v"}, c) {}
  void Step(std::vector<Parameter>& params, float lr) override {
    EnsureState(params);
    ++steps_;
    const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.epsilon, wd = config_.weight_decay;
    const float c1 = 1.f / (1.f - static_cast<float>(std::pow(double(b1), double(steps_))));
    const float c2 = 1.f / (1.f - static_cast<float>(std::pow(double(b2), double(steps_))));
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter& p = params[i];
      float* m = state_[0][i].data();
      float* v = state_[1][i].data();
      const float decay = IsBias(p) ? 0.f : wd;
      const int64_t n = p.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t j = 0; j < n; ++j) {
        const float g = p.grad[j];
        m[j] = b1 * m[j] + (1.f - b1) * g;
        v[j] = b2 * v[j] + (1.f - b2) * g * g;
        const float update = (m[j] * c1) / (std::sqrt(v[j] * c2) + eps);
        p.value[j] -= lr * (update + decay * p.value[j]);
      }
    }
  }
};

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& c) {
  if (!(c.weight_decay >= 0.f) || !std::isfinite(c.weight_decay)) {
    return InvalidArgumentError("optimizer: weight_decay must be >= 0");
  }
  if (c.name == "sgd") {
    if (!(c.momentum >= 0.f && c.momentum < 1.f)) return InvalidArgumentError("optimizer sgd: momentum must be in [0, 1)");
    return std::unique_ptr<Optimizer>(new Sgd(c));
  }
  if (c.name == "adam") {
    if (!(c.beta1 >= 0.f && c.beta1 < 1.f)) return InvalidArgumentError("optimizer adam: beta1 must be in [0, 1)");
    if (!(c.beta2 >= 0.f && c.beta2 < 1.f)) return InvalidArgumentError("optimizer adam: beta2 must be in [0, 1)");
    if (!(c.epsilon > 0.f)) return InvalidArgumentError("optimizer adam: epsilon must be positive");
    return std::unique_ptr<Optimizer>(new Adam(c));
  }
  return InvalidArgumentError("optimizer: unknown name '" + c.name + "' (expected adam or sgd)");
}

}  // namespace cosmoflow
