#include "core/nn/ensemble.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/base/crc32c.h"
#include "core/io/h5.h"

namespace cosmoflow {
namespace {

constexpr char kFormatName[] = "cosmoflow-ensemble";

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string ResolveMember(const std::string& manifest_path, const std::string& member) {
  if (!member.empty() && member[0] == '/') return member;
  return h5::DirName(manifest_path) + "/" + member;
}

std::string OutputText(const OutputSpec& o) {
  std::ostringstream os;
  os << o.name << " (unit '" << o.unit << "', offset " << o.offset << ", scale " << o.scale << ")";
  return os.str();
}

// Why member `m` cannot join member 0, or "" if it can.
std::string Disagreement(const ModelSpec& first, const ModelSpec& m) {
  if (m.outputs.size() != first.outputs.size()) {
    return "label normalisation differs from member 0's: " + std::to_string(m.outputs.size()) +
           " outputs vs " + std::to_string(first.outputs.size());
  }
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    const OutputSpec &a = m.outputs[i], &b = first.outputs[i];
    if (a.name != b.name || a.unit != b.unit || a.offset != b.offset || a.scale != b.scale)
      return "label normalisation differs from member 0's: output " + std::to_string(i) + " is " +
             OutputText(a) + ", member 0 has " + OutputText(b);
  }
  if (m.ToJson() != first.ToJson())
    return "spec '" + m.name + "' differs from member 0's spec '" + first.name +
           "' (layers, input or uncertainty)";
  return "";
}

}  // namespace

StatusOr<EnsembleManifest> ReadEnsembleManifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot read the ensemble manifest");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    return DataLossError(path + ": the ensemble manifest is not valid JSON: " + e.what());
  }
  auto field = [&](const char* key) {
    return j.is_object() && j.contains(key) ? j[key] : nlohmann::json();
  };
  if (field("format") != kFormatName)
    return InvalidArgumentError(path + ": not an ensemble manifest (field 'format' must be '" +
                                kFormatName + "')");
  if (!field("format_version").is_number_integer() || field("format_version").get<int64_t>() < 1 ||
      field("format_version").get<int64_t>() > kEnsembleFormatVersion)
    return FailedPreconditionError(path + ": ensemble manifest format_version " +
                                   field("format_version").dump() + ", this build reads versions 1 to " +
                                   std::to_string(kEnsembleFormatVersion));
  const nlohmann::json members = field("members");
  if (!members.is_array() || members.empty())
    return InvalidArgumentError(path + ": field 'members' must be a non-empty array");
  EnsembleManifest m;
  for (size_t i = 0; i < members.size(); ++i) {
    const nlohmann::json& e = members[i];
    const std::string where = path + ": members[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("checkpoint") || !e["checkpoint"].is_string() ||
        !e.contains("checksum") || !e["checksum"].is_string())
      return InvalidArgumentError(where + " needs string fields 'checkpoint' and 'checksum'");
    m.members.push_back({e["checkpoint"].get<std::string>(), e["checksum"].get<std::string>()});
  }
  if (const nlohmann::json c = field("calibration"); !c.is_null()) m.calibration_json = c.dump();
  return m;
}

Status WriteEnsembleManifest(const std::string& path, const EnsembleManifest& manifest) {
  nlohmann::ordered_json j;
  j["format"] = kFormatName;
  nlohmann::ordered_json calibration;
  if (!manifest.calibration_json.empty()) calibration = nlohmann::ordered_json::parse(manifest.calibration_json);
  // The oldest version that holds the calibration (see ensemble.h).
  j["format_version"] = calibration.contains("sigma_edge") ? 3 : calibration.contains("sigma_exponent") ? 2 : 1;
  j["members"] = nlohmann::ordered_json::array();
  for (const auto& m : manifest.members)
    j["members"].push_back({{"checkpoint", m.checkpoint}, {"checksum", m.checksum}});
  if (!calibration.is_null()) j["calibration"] = calibration;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) return InternalError(path + ": cannot write the ensemble manifest");
  }
  CF_RETURN_IF_ERROR(h5::FsyncPath(tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return InternalError(path + ": cannot rename the ensemble manifest into place");
  }
  return h5::FsyncPath(h5::DirName(path));
}

std::string FindEnsembleManifest(const std::string& path) {
  if (IsDirectory(path)) {
    const std::string inside = path + "/" + kEnsembleManifestName;
    struct stat st;
    return ::stat(inside.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? inside : "";
  }
  const std::string ext = ".json";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0
             ? path
             : "";
}

StatusOr<LoadedEnsemble> LoadEnsemble(const std::string& manifest_path) {
  CF_ASSIGN_OR_RETURN(EnsembleManifest manifest, ReadEnsembleManifest(manifest_path));
  LoadedEnsemble e;
  uint32_t crc = 0;
  for (size_t i = 0; i < manifest.members.size(); ++i) {
    const EnsembleMember& member = manifest.members[i];
    const std::string where =
        manifest_path + ": member " + std::to_string(i) + " (" + member.checkpoint + ")";
    const std::string file = ResolveMember(manifest_path, member.checkpoint);
    auto ckpt = ReadCheckpoint(file);
    if (!ckpt.ok()) return Status(ckpt.status().code(), where + ": " + ckpt.status().message());
    if (ckpt->checksum != member.checksum)
      return DataLossError(where + ": checksum " + ckpt->checksum + " but the manifest lists " +
                           member.checksum +
                           " (the member changed after the manifest was written)");
    if (i > 0) {
      const std::string why = Disagreement(e.members[0].spec, ckpt->spec);
      if (!why.empty()) return FailedPreconditionError(where + ": " + why);
    }
    crc = Crc32c(member.checksum.data(), member.checksum.size(), crc);
    e.members.push_back(std::move(*ckpt));
    e.paths.push_back(file);
  }
  if (!manifest.calibration_json.empty()) {
    auto c = CalibrationFromJson(manifest.calibration_json, e.members[0].spec);
    if (!c.ok()) return c.status().WithContext(manifest_path);
    e.calibration = std::move(*c);
    crc = Crc32c(manifest.calibration_json.data(), manifest.calibration_json.size(), crc);
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  e.checksum = hex;
  return e;
}

}  // namespace cosmoflow
