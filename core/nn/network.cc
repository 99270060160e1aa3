// The oneDNN network: a list of ops built once from a ModelSpec through the layer table, executed
// forward then backward. No op code lives here (core/nn/ops/ has one file per op).
//
// Layout policy: every op's src is the previous op's dst memory (a concrete desc), and every op
// chooses its own dst/weights layout. Reorders happen only at the edges: user input -> first op,
// last op -> user output, plain fp32 master weights <-> working weights.
// Backward diffs live in two ping-pong buffers (op i's diff_dst in buffer i % 2, its diff_src in the
// other), so training memory is activations + the two largest diffs, not a diff per layer.
#include "core/nn/network.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>

#include "core/base/log.h"
#include "core/nn/layer_table.h"
#include "core/nn/network_internal.h"
#include "core/nn/op.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow {

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return InvalidArgumentError("unknown precision '" + name + "' (expected fp32 or bf16)");
}

bool Bf16Supported() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

namespace nn_internal {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float DropoutUniform(uint64_t seed, uint64_t step, int layer, int64_t index) {
  uint64_t h = SplitMix64(seed ^ SplitMix64(step * 0x100000001B3ull + static_cast<uint64_t>(layer)));
  h = SplitMix64(h ^ static_cast<uint64_t>(index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedBuffer AllocateAligned(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 64) + 4095) / 4096 * 4096;
  return AlignedBuffer(std::aligned_alloc(4096, rounded));
}

}  // namespace nn_internal

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using nn_internal::AlignedBuffer;
using nn_internal::KernelTimings;
using nn_internal::Op;
using nn_internal::OpArgs;
using nn_internal::OpContext;
using nn_internal::ParamInit;
using nn_internal::ParamStore;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// Fills `p` by its init rule; `index` (the tensor's position among all tensors) seeds He-uniform.
void InitTensor(ParamStore& p, ParamInit init, uint64_t seed, size_t index) {
  if (init != ParamInit::kHeUniform) {
    std::fill(p.value.begin(), p.value.end(), init == ParamInit::kOnes ? 1.f : 0.f);
    return;
  }
  int64_t fan_in = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) fan_in *= p.shape[d];
  const float bound = std::sqrt(6.f / static_cast<float>(fan_in));
  uint64_t state = nn_internal::SplitMix64(seed * 0x9E3779B97F4A7C15ull + index + 1);
  for (auto& v : p.value) {
    state = nn_internal::SplitMix64(state);
    float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
    v = (2.f * u - 1.f) * bound;
  }
}

class NetworkImpl : public Network {
 public:
  const ModelSpec& spec() const override { return spec_; }
  const NetworkOptions& options() const override { return options_; }
  std::vector<Parameter>& parameters() override { return params_; }
  std::vector<KernelChoice> ChosenKernels() const override;

  Status Build(const ModelSpec& spec, const NetworkOptions& options);

  void ParametersUpdated() override {
    for (auto& op : ops_) op->RefreshWeights(ctx_);
    ctx_.strm.wait();
  }
  void InitParameters(uint64_t seed) override;
  Status LoadParameters(const std::vector<NamedTensor>& tensors) override;
  std::vector<NamedTensor> ExportParameters() const override;
  void Forward(const float* src, float* dst) override;
  void Backward(const float* diff_dst, const std::function<void(int)>& on_grad_ready) override;
  void SetTrainingStep(uint64_t step) override { ctx_.step = step; }
  void BeginStatisticsPass() override {
    pass_saved_step_ = ctx_.step;
    ctx_.statistics_pass = 1;
  }
  void EndStatisticsPass() override {
    ctx_.step = pass_saved_step_;
    ctx_.statistics_pass = 0;
  }
  void SetProfiling(bool on) override { profiling_ = on; }
  std::string ProfileReport() const override;

 private:
  // A tensor of the network: trainable ones are parameters()[index]; state ones are saved only.
  struct Tensor {
    std::unique_ptr<ParamStore> store;
    ParamInit init;
    bool trainable;
  };

  Status SetUpContext(const ModelSpec& spec, const NetworkOptions& options);
  void BuildInputEdge();
  void BuildOps();
  void AddTensors(OpArgs& args, const nn_internal::LayerRow& row, const nn_internal::ActShape& in);
  void BuildOutputEdge();
  void BindBackward();
  void PublishParameters();

  ModelSpec spec_;
  NetworkOptions options_;
  OpContext ctx_;
  std::unique_ptr<KernelTimings> timings_;  // kMeasure only
  std::vector<Tensor> tensors_;  // every tensor, in layer order (the order seeds initialisation)
  std::vector<Parameter> params_;
  std::vector<std::unique_ptr<Op>> ops_;

  // Edges.
  memory cur_md_holder_;  // the activation the next op reads while building
  memory::desc cur_md_;
  memory user_src_, net_src_;
  bool src_reorder_ = false;
  dnnl::reorder src_reorder_prim_;
  memory user_dst_;
  dnnl::reorder dst_reorder_prim_;
  memory user_diff_;
  dnnl::reorder diff_reorder_prim_;
  int outputs_ = 0;
  AlignedBuffer diff_buffers_[2];

  bool profiling_ = false;
  uint64_t pass_saved_step_ = 0;  // the training step at BeginStatisticsPass()
  double edge_fwd_ms_ = 0, edge_bwd_ms_ = 0;
};

Status NetworkImpl::SetUpContext(const ModelSpec& spec, const NetworkOptions& options) {
  CF_RETURN_IF_ERROR(spec.Validate());
  if (options.batch <= 0 || options.batch > 4096) {
    return InvalidArgumentError("network: batch must be in [1, 4096], got " + std::to_string(options.batch));
  }
  CF_RETURN_IF_ERROR(ValidateKernelOptions(options.kernels));
  CF_ASSIGN_OR_RETURN(KernelOptions env, KernelOptionsFromEnvironment());
  spec_ = spec;
  options_ = options;
  ctx_.dt = options.precision == Precision::kBf16 ? Dt::bf16 : Dt::f32;
  ctx_.training = options.training;
  ctx_.batch = options.batch;
  ctx_.seed = options.seed;
  ctx_.kernels = options.kernels;
  for (const auto& [key, value] : env) ctx_.kernels[key] = value;  // the operator's override wins
  ctx_.allreduce_sum = options.allreduce_sum;
  ctx_.selection = options.kernel_selection;
  if (ctx_.selection == KernelSelection::kMeasure) {
    timings_ = std::make_unique<KernelTimings>(options.kernel_cache);
    ctx_.timings = timings_.get();
  }
  if (options.covariance_gradient_head_only && spec.uncertainty != UncertaintyHead::kNone)
    ctx_.head_gradient_outputs = static_cast<int>(spec.outputs.size());
  if (ctx_.dt == Dt::bf16 && !Bf16Supported()) {
    return FailedPreconditionError("network: bf16 needs a CPU with AVX512-BF16 or AMX");
  }
  return Status::Ok();
}

Status NetworkImpl::Build(const ModelSpec& spec, const NetworkOptions& options) {
  CF_RETURN_IF_ERROR(SetUpContext(spec, options));
  BuildInputEdge();
  BuildOps();
  // The fused first block reads the user's fp32 input itself: no input reorder.
  if (ops_.front()->ReadsUserInput()) src_reorder_ = false;
  BuildOutputEdge();
  if (ctx_.training) BindBackward();
  if (timings_) {
    // The cache only saves re-timing: a file that cannot be written costs a warning, not the network.
    if (Status saved = timings_->Save(); !saved.ok()) {
      CF_LOG(WARNING) << "kernel timings not cached: " << saved.message();
    }
    ctx_.timings = nullptr;
    timings_.reset();
  }
  PublishParameters();
  InitParameters(options.seed);
  return Status::Ok();
}

void NetworkImpl::BuildInputEdge() {
  const int64_t n = ctx_.batch, c0 = spec_.input_channels, side = spec_.input_side;
  outputs_ = spec_.NetworkOutputs();  // the last dense layer's units (spec.h: an uncertainty head widens it)
  user_src_ = memory(memory::desc({n, c0, side, side, side}, Dt::f32, Tag::ncdhw), ctx_.eng, DNNL_MEMORY_NONE);
  if (ctx_.dt == Dt::f32) {
    cur_md_holder_ = user_src_;
  } else {
    net_src_ = memory(memory::desc({n, c0, side, side, side}, ctx_.dt, Tag::ncdhw), ctx_.eng);
    src_reorder_prim_ = dnnl::reorder(user_src_, net_src_);
    src_reorder_ = true;
    cur_md_holder_ = net_src_;
  }
  cur_md_ = cur_md_holder_.get_desc();
}

// Creates the tensors of the layer `args.index` by its row's rules, named "<op name>.<suffix>".
void NetworkImpl::AddTensors(OpArgs& args, const nn_internal::LayerRow& row, const nn_internal::ActShape& in) {
  for (auto& rule : row.params(args.layer(), in)) {
    Tensor t{std::make_unique<ParamStore>(), rule.init, rule.trainable};
    t.store->name = args.name + "." + rule.suffix;
    t.store->shape = rule.shape;
    int64_t numel = 1;
    for (auto d : rule.shape) numel *= d;
    t.store->value.assign(numel, 0.f);
    if (ctx_.training && rule.trainable) t.store->grad.assign(numel, 0.f);
    int index = -1;
    if (rule.trainable) {
      index = 0;
      for (const auto& other : tensors_) index += other.trainable ? 1 : 0;
    }
    args.params.push_back(t.store.get());
    args.param_indices.push_back(index);
    tensors_.push_back(std::move(t));
  }
}

void NetworkImpl::BuildOps() {
  const auto& L = spec_.layers;
  std::map<std::string, int> counters;
  nn_internal::ActShape shape{spec_.input_channels, spec_.input_side, false};
  memory cur = cur_md_holder_;
  for (size_t li = 0; li < L.size();) {
    const nn_internal::LayerRow& row = nn_internal::RowOf(L[li].type);
    OpArgs args{ctx_, L, li, row.name_prefix + std::to_string(counters[row.counter_key]), cur_md_, cur,
                {}, {}};
    args.first_op = ops_.empty();
    AddTensors(args, row, shape);
    std::unique_ptr<Op> op;
    if (li == 0) op = nn_internal::MakeFusedFirstBlockOp(args);
    if (!op && row.make_op) op = row.make_op(args);
    // Counters advance for every layer the op consumed, but a leaky ReLU fused into a conv or dense.
    for (size_t k = 0; k < args.consumed; ++k) {
      const nn_internal::LayerRow& r = nn_internal::RowOf(L[li + k].type);
      if (k == 1 && args.consumed == 2 && row.absorbs_next_leaky) continue;
      ++counters[r.counter_key];
      shape = r.shape(L[li + k], shape);
    }
    li += args.consumed;
    if (!op) continue;  // flatten, or dropout at inference: the next op reads the same activation
    cur_md_ = op->dst_md;
    cur = op->dst;
    ops_.push_back(std::move(op));
  }
}

void NetworkImpl::BuildOutputEdge() {
  memory::desc user_out_md({ctx_.batch, outputs_}, Dt::f32, Tag::nc);
  user_dst_ = memory(user_out_md, ctx_.eng, DNNL_MEMORY_NONE);
  dst_reorder_prim_ = dnnl::reorder(ops_.back()->dst, user_dst_);
}

void NetworkImpl::BindBackward() {
  size_t sizes[2] = {0, 0};
  for (size_t i = 0; i < ops_.size(); ++i) sizes[i % 2] = std::max(sizes[i % 2], ops_[i]->dst_md.get_size());
  for (int p = 0; p < 2; ++p) diff_buffers_[p] = nn_internal::AllocateAligned(sizes[p]);
  for (size_t i = 0; i < ops_.size(); ++i) {
    ops_[i]->diff_dst = memory(ops_[i]->dst_md, ctx_.eng, diff_buffers_[i % 2].get());
    if (i > 0) ops_[i]->diff_src = memory(ops_[i]->src_md, ctx_.eng, diff_buffers_[(i + 1) % 2].get());
    ops_[i]->SetUpBackward(ctx_, i > 0);
  }
  user_diff_ = memory(memory::desc({ctx_.batch, outputs_}, Dt::f32, Tag::nc), ctx_.eng, DNNL_MEMORY_NONE);
  diff_reorder_prim_ = dnnl::reorder(user_diff_, ops_.back()->diff_dst);
}

void NetworkImpl::PublishParameters() {
  params_.clear();
  for (const auto& t : tensors_) {
    if (!t.trainable) continue;
    Parameter v;
    v.name = t.store->name;
    v.shape = t.store->shape;
    v.value = t.store->value.data();
    v.grad = ctx_.training ? t.store->grad.data() : nullptr;
    params_.push_back(v);
  }
}

void NetworkImpl::InitParameters(uint64_t seed) {
  for (size_t i = 0; i < tensors_.size(); ++i) InitTensor(*tensors_[i].store, tensors_[i].init, seed, i);
  ParametersUpdated();
}

Status NetworkImpl::LoadParameters(const std::vector<NamedTensor>& tensors) {
  std::vector<const NamedTensor*> found;
  for (const auto& t : tensors_) {
    const ParamStore& p = *t.store;
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](const NamedTensor& c) { return c.name == p.name; });
    if (it == tensors.end()) return NotFoundError("parameter '" + p.name + "' missing from the loaded tensors");
    if (it->shape != p.shape || static_cast<int64_t>(it->data.size()) != static_cast<int64_t>(p.value.size())) {
      return InvalidArgumentError("parameter '" + p.name + "': shape " + ShapeString(it->shape) +
                                  " does not match the network's " + ShapeString(p.shape));
    }
    found.push_back(&*it);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    std::copy(found[i]->data.begin(), found[i]->data.end(), tensors_[i].store->value.begin());
  }
  ParametersUpdated();
  return Status::Ok();
}

std::vector<NamedTensor> NetworkImpl::ExportParameters() const {
  std::vector<NamedTensor> out;
  for (bool trainable : {true, false}) {
    for (const auto& t : tensors_) {
      if (t.trainable == trainable) out.push_back({t.store->name, t.store->shape, t.store->value});
    }
  }
  return out;
}

void NetworkImpl::Forward(const float* src, float* dst) {
  auto t0 = Clock::now();
  if (ctx_.training) ++ctx_.step;  // a fresh dropout mask per training forward; Backward reuses it
  user_src_.set_data_handle(const_cast<float*>(src));
  if (src_reorder_) src_reorder_prim_.execute(ctx_.strm, user_src_, net_src_);
  ops_.front()->SetUserInput(src);
  edge_fwd_ms_ = Ms(t0, Clock::now());
  for (auto& op : ops_) {
    auto a = Clock::now();
    op->Forward(ctx_);
    if (profiling_) {
      ctx_.strm.wait();
      op->fwd_ms = Ms(a, Clock::now());
    }
  }
  auto t2 = Clock::now();
  user_dst_.set_data_handle(dst);
  dst_reorder_prim_.execute(ctx_.strm, ops_.back()->dst, user_dst_);
  ctx_.strm.wait();
  edge_fwd_ms_ += Ms(t2, Clock::now());
  if (ctx_.statistics_pass > 0) ++ctx_.statistics_pass;
}

void NetworkImpl::Backward(const float* diff_dst, const std::function<void(int)>& on_grad_ready) {
  assert(ctx_.training && "Backward needs a network created with training = true");
  if (!ctx_.training) return;
  auto t0 = Clock::now();
  user_diff_.set_data_handle(const_cast<float*>(diff_dst));
  diff_reorder_prim_.execute(ctx_.strm, user_diff_, ops_.back()->diff_dst);
  edge_bwd_ms_ = Ms(t0, Clock::now());
  for (size_t i = ops_.size(); i-- > 0;) {
    auto a = Clock::now();
    ops_[i]->Backward(ctx_, i > 0);
    ctx_.strm.wait();
    if (profiling_) ops_[i]->bwd_ms = Ms(a, Clock::now());
    if (on_grad_ready) {
      for (auto it = ops_[i]->params.rbegin(); it != ops_[i]->params.rend(); ++it) on_grad_ready(*it);
    }
  }
}

std::vector<KernelChoice> NetworkImpl::ChosenKernels() const {
  std::vector<KernelChoice> all;
  for (const auto& op : ops_) {
    for (auto& k : op->Kernels()) all.push_back(std::move(k));
  }
  return all;
}

std::string KernelsOf(const Op& op) {
  std::string s;
  for (const auto& k : op.Kernels()) s += (s.empty() ? "" : " ") + DescribeKernel(k);
  return s;
}

std::string NetworkImpl::ProfileReport() const {
  std::ostringstream os;
  os << std::fixed;
  double tf = edge_fwd_ms_, tb = edge_bwd_ms_;
  for (const auto& op : ops_) {
    tf += op->fwd_ms;
    tb += op->bwd_ms;
  }
  os << "| op | fwd ms | fwd GFLOP/s | bwd ms | bwd GFLOP/s | share | workspace MiB | kernels (pass=candidate(implementation)) |\n";
  os << "|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = *ops_[i];
    double ff = op.FwdFlops(), bf = op.BwdFlops(i > 0);
    os << "| " << op.name() << " | " << std::setprecision(2) << op.fwd_ms << " | " << std::setprecision(0)
       << (ff > 0 && op.fwd_ms > 0 ? ff / op.fwd_ms / 1e6 : 0) << " | " << std::setprecision(2) << op.bwd_ms
       << " | " << std::setprecision(0) << (bf > 0 && op.bwd_ms > 0 ? bf / op.bwd_ms / 1e6 : 0) << " | "
       << std::setprecision(1) << 100.0 * (op.fwd_ms + op.bwd_ms) / std::max(1e-9, tf + tb) << "% | "
       << std::setprecision(1) << op.WorkspaceBytes() / 1048576.0 << " | " << KernelsOf(op) << " |\n";
  }
  os << "| edges (input/output reorders) | " << std::setprecision(2) << edge_fwd_ms_ << " | | " << edge_bwd_ms_
     << " | | " << std::setprecision(1) << 100.0 * (edge_fwd_ms_ + edge_bwd_ms_) / std::max(1e-9, tf + tb)
     << "% | | |\n";
  os << "| total | " << std::setprecision(2) << tf << " | | " << tb << " | | 100% | | |\n";
  return os.str();
}

}  // namespace

StatusOr<std::unique_ptr<Network>> Network::Create(const ModelSpec& spec, const NetworkOptions& options) {
  auto net = std::make_unique<NetworkImpl>();
  try {
    CF_RETURN_IF_ERROR(net->Build(spec, options));
  } catch (const dnnl::error& e) {
    return InternalError("network '" + spec.name + "': oneDNN refused a primitive: " + e.what());
  } catch (const std::invalid_argument& e) {
    return InvalidArgumentError("network '" + spec.name + "': " + e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("network '" + spec.name + "': out of memory building batch " +
                                  std::to_string(options.batch));
  }
  return std::unique_ptr<Network>(std::move(net));
}

}  // namespace cosmoflow
