// Choice by measurement for conv3d's passes (NetworkOptions::kernel_selection = kMeasure): every
// candidate that supports the pass runs on scratch tensors of the pass's real descs, after one
// untimed warm-up run, and the median of up to kMaxRuns timed runs is its figure. Figures are
// cached per problem (s.ctx.timings, keyed by pass, shapes, layouts, precision, ISA and threads),
// so a second network with the same problem on the same machine does not time again.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "core/base/log.h"
#include "core/nn/ops/conv3d.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Clock = std::chrono::steady_clock;

// Timed runs after the warm-up: enough for a median, few enough that the largest layers time in
// seconds; a candidate whose first timed run is this many times the best so far stops there.
constexpr int kMaxRuns = 5;
constexpr double kRunsBudgetSeconds = 0.3;
constexpr double kHopelessRatio = 3.0;

// The memory desc as text: data type, dims, strides and inner blocks (what decides the kernel).
std::string DescKey(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::ostringstream os;
  os << "t" << static_cast<int>(d.data_type) << ":";
  for (int i = 0; i < d.ndims; ++i) os << (i ? "x" : "") << d.dims[i];
  if (d.format_kind != dnnl_blocked) return os.str() + ":f" + std::to_string(static_cast<int>(d.format_kind));
  os << ":s";
  for (int i = 0; i < d.ndims; ++i) os << (i ? "." : "") << d.format_desc.blocking.strides[i];
  for (int i = 0; i < d.format_desc.blocking.inner_nblks; ++i)
    os << ":b" << d.format_desc.blocking.inner_idxs[i] << "x" << d.format_desc.blocking.inner_blks[i];
  return os.str();
}

std::string ProblemKey(const ConvSetup& s, const char* pass) {
  const ConvGeom& g = s.g;
  std::ostringstream os;
  os << "conv3d." << pass << " v" << kKernelTimingsVersion << " n" << g.n << " ic" << g.ic << " oc" << g.oc << " side"
     << g.side << " k" << g.k << " s" << g.stride << " pad" << g.pad_left << "," << g.pad_right
     << " first" << s.first_op << " leaky" << (s.leaky_alpha >= 0) << " train" << s.ctx.training << " src "
     << DescKey(s.src_md) << " dst " << DescKey(s.dst_md) << " isa" << static_cast<int>(dnnl::get_effective_cpu_isa())
     << " threads" << omp_get_max_threads();
  return os.str();
}

// Deterministic values in [-1, 1) in the memory's data type (fp32 or bf16; others left as zeros).
void Fill(memory& m) {
  const size_t bytes = m.get_desc().get_size();
  auto* p = static_cast<unsigned char*>(m.get_data_handle());
  std::memset(p, 0, bytes);
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  };
  if (m.get_desc().data_type() == memory::data_type::f32) {
    auto* f = reinterpret_cast<float*>(p);
    for (size_t i = 0; i < bytes / sizeof(float); ++i) f[i] = next();
  } else if (m.get_desc().data_type() == memory::data_type::bf16) {
    auto* h = reinterpret_cast<uint16_t*>(p);
    for (size_t i = 0; i < bytes / sizeof(uint16_t); ++i) {
      const float v = next();
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      h[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

// The tensors one pass reads and writes, with the descs the op runs on.
struct Scratch {
  memory a, b, out;
  Scratch(const ConvSetup& s, const std::string& pass) {
    OpContext& c = s.ctx;
    a = memory(s.src_md, c.eng);
    Fill(a);
    if (pass == "fwd") {
      b = memory(memory::desc({s.g.oc}, memory::data_type::f32, memory::format_tag::x), c.eng);
      out = memory(s.dst_md, c.eng);
    } else {
      b = memory(s.dst_md, c.eng);
      if (pass == "bwd_data") out = memory(s.src_md, c.eng);
    }
    Fill(b);
  }
};

// Seconds per run of one candidate: the median of the timed runs after an untimed warm-up (which
// pays for oneDNN's JIT and first-touch page faults), or the first timed run alone when that is
// over kHopelessRatio x `best`.
double TimeCandidate(const ConvCandidate& cand, const ConvSetup& s, Scratch& t, double best) {
  auto kernel = cand.make(s);
  memory* out = t.out ? &t.out : nullptr;
  auto run = [&] {
    const auto t0 = Clock::now();
    kernel->Run(s.ctx, t.a, t.b, out);
    s.ctx.strm.wait();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  run();
  const double first = run();
  if (first > kHopelessRatio * best) return first;
  const int runs = std::clamp(static_cast<int>(kRunsBudgetSeconds / std::max(first, 1e-6)), 1, kMaxRuns - 1);
  std::vector<double> times = {first};
  for (int i = 0; i < runs; ++i) times.push_back(run());
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace

size_t MeasureCandidates(const std::vector<ConvCandidate>& list, const ConvSetup& s, const char* pass, size_t rule) {
  std::vector<size_t> supported;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].supports(s)) supported.push_back(i);
  }
  if (supported.size() < 2) return rule;
  const std::string problem = ProblemKey(s, pass);
  std::vector<double> seconds(list.size(), std::numeric_limits<double>::infinity());
  std::unique_ptr<Scratch> scratch;
  bool timed = false;
  double best = std::numeric_limits<double>::infinity();
  for (size_t i : supported) {
    std::optional<double> known = s.ctx.timings ? s.ctx.timings->Find(problem, list[i].name) : std::nullopt;
    if (!known) {
      if (!scratch) scratch = std::make_unique<Scratch>(s, pass);
      known = TimeCandidate(list[i], s, *scratch, best);
      if (s.ctx.timings) s.ctx.timings->Put(problem, list[i].name, *known);
      timed = true;
    }
    seconds[i] = *known;
    best = std::min(best, *known);
  }
  size_t chosen = rule;
  for (size_t i : supported) {
    if (seconds[i] < seconds[chosen] && seconds[i] * (1 + kMeasureMargin) < seconds[rule]) chosen = i;
  }
  std::ostringstream line;
  line << "kernel choice " << s.op_name << "." << pass << (timed ? " (timed):" : " (cached timings):");
  for (size_t i : supported) line << " " << list[i].name << " " << seconds[i] * 1e3 << " ms";
  line << " -> " << list[chosen].name;
  CF_LOG(INFO) << line.str();
  return chosen;
}

}  // namespace cosmoflow::nn_internal
