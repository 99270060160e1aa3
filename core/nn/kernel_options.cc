// Kernel choices: validation of NetworkOptions::kernels and the COSMOFLOW_KERNELS override (the
// one place an environment variable chooses kernels).
#include <cctype>
#include <cstdlib>
#include <set>

#include "core/nn/network.h"
#include "core/nn/op.h"

namespace cosmoflow {
namespace {

// The values each pass key takes ("auto" is accepted everywhere).
const std::map<std::string, std::set<std::string>>& KernelValues() {
  static const std::map<std::string, std::set<std::string>> kValues = {
      {"fwd", {"winograd", "fft", "onednn"}},
      {"bwd_data", {"winograd", "fft", "transposed", "onednn"}},
      {"bwd_weights", {"winograd", "fft", "channels_last_wgrad", "first_conv_wgrad", "onednn"}},
      {"layout", {"channels_last", "no_channels_last"}},
  };
  return kValues;
}

// "conv" or "conv<digits>".
bool IsConvName(const std::string& s) {
  if (s.rfind("conv", 0) != 0) return false;
  for (size_t i = 4; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

}  // namespace

Status ValidateKernelOptions(const KernelOptions& kernels) {
  for (const auto& [key, value] : kernels) {
    const std::string where = "kernel option '" + key + "=" + value + "'";
    if (key == "first_block") {
      if (value != "auto" && value != "fused" && value != "onednn") {
        return InvalidArgumentError(where + ": first_block takes fused, onednn or auto");
      }
      continue;
    }
    const size_t dot = key.find('.');
    const auto pass = dot == std::string::npos ? KernelValues().end() : KernelValues().find(key.substr(dot + 1));
    if (dot == std::string::npos || !IsConvName(key.substr(0, dot)) || pass == KernelValues().end()) {
      return InvalidArgumentError(where + ": unknown key (expected first_block, conv.<pass> or convN.<pass>, "
                                          "pass one of fwd, bwd_data, bwd_weights, layout)");
    }
    if (value != "auto" && pass->second.count(value) == 0) {
      std::string known;
      for (const auto& v : pass->second) known += (known.empty() ? "" : ", ") + v;
      return InvalidArgumentError(where + ": unknown value (expected auto, " + known + ")");
    }
  }
  return Status::Ok();
}

StatusOr<KernelOptions> ParseKernelOptions(const std::string& text) {
  KernelOptions out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return InvalidArgumentError("'" + item + "' is not key=value");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  CF_RETURN_IF_ERROR(ValidateKernelOptions(out));
  return out;
}

std::string FormatKernelOptions(const KernelOptions& kernels) {
  std::string s;
  for (const auto& [key, value] : kernels) s += (s.empty() ? "" : ",") + key + "=" + value;
  return s;
}

StatusOr<KernelOptions> KernelOptionsFromEnvironment() {
  const char* env = std::getenv("COSMOFLOW_KERNELS");
  if (env == nullptr) return KernelOptions{};
  auto parsed = ParseKernelOptions(env);
  if (!parsed.ok()) return parsed.status().WithContext("COSMOFLOW_KERNELS");
  return parsed;
}

const char* KernelSelectionName(KernelSelection s) { return s == KernelSelection::kMeasure ? "measure" : "rule"; }

StatusOr<KernelSelection> ParseKernelSelection(const std::string& name) {
  if (name == "rule") return KernelSelection::kRule;
  if (name == "measure") return KernelSelection::kMeasure;
  return InvalidArgumentError("unknown kernel selection '" + name + "' (expected rule or measure)");
}

std::string DefaultKernelCachePath() {
  if (const char* p = std::getenv("COSMOFLOW_KERNEL_CACHE"); p != nullptr && *p != '\0') return p;
  if (const char* p = std::getenv("XDG_CACHE_HOME"); p != nullptr && *p != '\0')
    return std::string(p) + "/cosmoflow/kernel-timings.tsv";
  if (const char* p = std::getenv("HOME"); p != nullptr && *p != '\0')
    return std::string(p) + "/.cache/cosmoflow/kernel-timings.tsv";
  return "";
}

KernelOptions PinnedKernels(const std::vector<KernelChoice>& chosen) {
  KernelOptions pinned;
  for (const auto& k : chosen) {
    const std::string op = k.op.substr(0, k.op.find('+'));  // "conv1+leaky" -> "conv1"
    const auto values = KernelValues().find(k.pass);
    if (!IsConvName(op) || op == "conv" || values == KernelValues().end() || values->second.count(k.kernel) == 0)
      continue;
    pinned[op + "." + k.pass] = k.kernel;
  }
  return pinned;
}

std::string DescribeKernel(const KernelChoice& k) { return k.pass + "=" + k.kernel + "(" + k.impl + ")"; }

std::string DescribeConvKernels(const std::vector<KernelChoice>& chosen) {
  std::string s;
  for (const auto& k : chosen) {
    if (k.op.rfind("conv", 0) == 0) s += (s.empty() ? "" : ", ") + k.op + " " + DescribeKernel(k);
  }
  return s;
}

namespace nn_internal {

std::string OpContext::Forced(const std::string& op_name, const std::string& kind, const std::string& pass) const {
  for (const std::string& key : {op_name + "." + pass, kind.empty() ? pass : kind + "." + pass}) {
    auto it = kernels.find(key);
    if (it != kernels.end() && it->second != "auto") return it->second;
  }
  return "";
}

const LayerSpec* OpArgs::NextLeaky() const {
  return index + 1 < layers.size() && layers[index + 1].type == LayerType::kLeakyRelu ? &layers[index + 1] : nullptr;
}

}  // namespace nn_internal
}  // namespace cosmoflow
