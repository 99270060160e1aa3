#include "core/nn/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/base/crc32c.h"
#include "core/base/log.h"
#include "core/io/h5.h"

namespace cosmoflow {

using h5::Handle;
using Guard = std::lock_guard<std::recursive_mutex>;

namespace {

constexpr char kFormatName[] = "cosmoflow-checkpoint";
constexpr char kLatestName[] = "LATEST";

// The checksum covers the spec and every tensor (name, shape, bytes) in the order written, plus the
// training state, so that any flipped bit in the payload is caught on read.
uint32_t PayloadChecksum(const std::string& spec_json, const std::string& calibration_json, const TrainingState& st,
                         const std::vector<NamedTensor>& weights, const std::vector<NamedTensor>& opt) {
  uint32_t c = Crc32c(spec_json.data(), spec_json.size());
  // Empty for version 1 files, whose checksums stay what they were.
  c = Crc32c(calibration_json.data(), calibration_json.size(), c);
  int64_t ints[4] = {st.step, st.epoch, st.samples_seen, int64_t(st.rng_seed)};
  c = Crc32c(ints, sizeof ints, c);
  c = Crc32c(st.optimizer.data(), st.optimizer.size(), c);
  for (const auto* list : {&weights, &opt}) {
    for (const auto& t : *list) {
      c = Crc32c(t.name.data(), t.name.size(), c);
      c = Crc32c(t.shape.data(), t.shape.size() * sizeof(int64_t), c);
      c = Crc32c(t.data.data(), t.data.size() * sizeof(float), c);
    }
  }
  return c;
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

Status WriteTensors(hid_t file, const char* group, const std::vector<NamedTensor>& tensors,
                    const std::string& path) {
  Handle g(H5Gcreate2(file, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) return InternalError(path + ": cannot create group " + group);
  std::vector<std::string> order;
  for (const auto& t : tensors) {
    if (t.numel() != int64_t(t.data.size()))
      return InvalidArgumentError(path + ": tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                                  " values for its shape");
    if (t.name.empty() || t.name.find('/') != std::string::npos)
      return InvalidArgumentError(path + ": invalid tensor name '" + t.name + "'");
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    if (dims.empty()) dims.push_back(1);
    Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
    Handle ds(H5Dcreate2(g.get(), t.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT),
              H5Dclose);
    if (!ds.valid() || H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.data()) < 0)
      return InternalError(path + ": cannot write tensor '" + t.name + "'");
    order.push_back(t.name);
  }
  // HDF5 lists links alphabetically; keep the writer's order so readers restore it exactly.
  return h5::WriteStringListAttr(g.get(), "order", order);
}

StatusOr<std::vector<NamedTensor>> ReadTensors(hid_t file, const char* group, const std::string& path) {
  std::vector<NamedTensor> out;
  if (!h5::Exists(file, group)) return NotFoundError(path + ": missing group /" + std::string(group));
  Handle g(H5Gopen2(file, group, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) return DataLossError(path + ": cannot open group /" + std::string(group));
  CF_ASSIGN_OR_RETURN(auto order, h5::ReadStringListAttr(g.get(), "order"));
  for (const auto& name : order) {
    CF_ASSIGN_OR_RETURN(Handle ds, h5::OpenDataset(g.get(), name, path));
    NamedTensor t;
    t.name = name;
    for (auto d : h5::Dims(ds.get())) t.shape.push_back(int64_t(d));
    t.data.resize(t.numel());
    if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.data()) < 0)
      return DataLossError(path + ": cannot read tensor '" + name + "' (truncated or corrupt file?)");
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

StatusOr<std::string> WriteCheckpoint(const std::string& path, const Checkpoint& ckpt) {
  CF_RETURN_IF_ERROR(ckpt.spec.Validate().WithContext(path));
  CF_RETURN_IF_ERROR(ValidateCalibration(ckpt.calibration, ckpt.spec).WithContext(path));
  const std::string spec_json = ckpt.spec.ToJson();
  const std::string calibration_json = ckpt.calibration.empty() ? "" : CalibrationToJson(ckpt.calibration, ckpt.spec);
  // The oldest version that holds everything in this checkpoint (see checkpoint.h).
  const int64_t version = ckpt.calibration.has_edge()       ? 4
                          : ckpt.calibration.has_exponent() ? 3
                          : calibration_json.empty() && ckpt.spec.uncertainty == UncertaintyHead::kNone ? 1
                                                                                                       : 2;
  const std::string checksum =
      Hex(PayloadChecksum(spec_json, calibration_json, ckpt.state, ckpt.weights, ckpt.optimizer_state));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    Guard lock(h5::Lock());
    CF_ASSIGN_OR_RETURN(Handle file, h5::CreateFile(tmp));
    auto write_all = [&]() -> Status {
      hid_t root = file.get();
      CF_RETURN_IF_ERROR(WriteTensors(root, "weights", ckpt.weights, path));
      CF_RETURN_IF_ERROR(WriteTensors(root, "optimizer", ckpt.optimizer_state, path));
      nlohmann::json prov(ckpt.provenance);
      CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "format", kFormatName));
      CF_RETURN_IF_ERROR(h5::WriteInt64Attr(root, "format_version", version));
      CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "spec_json", spec_json));
      if (!calibration_json.empty())
        CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "calibration_json", calibration_json));
      CF_RETURN_IF_ERROR(h5::WriteInt64Attr(root, "step", ckpt.state.step));
      CF_RETURN_IF_ERROR(h5::WriteInt64Attr(root, "epoch", ckpt.state.epoch));
      CF_RETURN_IF_ERROR(h5::WriteInt64Attr(root, "samples_seen", ckpt.state.samples_seen));
      CF_RETURN_IF_ERROR(h5::WriteInt64Attr(root, "rng_seed", int64_t(ckpt.state.rng_seed)));
      CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "optimizer", ckpt.state.optimizer));
      // Provenance holds command lines and paths, which need not be UTF-8: replaced, not thrown.
      const std::string prov_json =
          prov.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "provenance_json", prov_json));
      // Written last: a file without it is never accepted.
      CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "checksum", checksum));
      if (H5Fflush(root, H5F_SCOPE_GLOBAL) < 0) return InternalError(path + ": flush failed");
      return Status::Ok();
    };
    Status s = write_all();
    file.reset();
    if (!s.ok()) {
      std::remove(tmp.c_str());
      return s;
    }
  }
  CF_RETURN_IF_ERROR(h5::FsyncPath(tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return InternalError(path + ": cannot rename temporary checkpoint into place");
  }
  CF_RETURN_IF_ERROR(h5::FsyncPath(h5::DirName(path)));
  return checksum;
}

StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  Guard lock(h5::Lock());
  CF_ASSIGN_OR_RETURN(Handle file, h5::OpenFile(path));
  hid_t root = file.get();
  auto fmt = h5::ReadStringAttr(root, "format");
  if (!fmt.ok() || *fmt != kFormatName)
    return InvalidArgumentError(path + ": not a CosmoFlow checkpoint (attribute format='" +
                                std::string(kFormatName) + "' missing)");
  CF_ASSIGN_OR_RETURN(int64_t version, h5::ReadInt64Attr(root, "format_version"));
  if (version < 1 || version > kCheckpointFormatVersion)
    return FailedPreconditionError(path + ": checkpoint format version " + std::to_string(version) +
                                   ", this build reads versions 1 to " + std::to_string(kCheckpointFormatVersion));
  auto stored = h5::ReadStringAttr(root, "checksum");
  if (!stored.ok()) return DataLossError(path + ": checkpoint has no checksum (incomplete write?)");
  Checkpoint ck;
  CF_ASSIGN_OR_RETURN(std::string spec_json, h5::ReadStringAttr(root, "spec_json"));
  auto spec = ModelSpec::FromJson(spec_json);
  if (!spec.ok()) return spec.status().WithContext(path + ": invalid model spec in checkpoint");
  ck.spec = std::move(*spec);
  CF_ASSIGN_OR_RETURN(ck.state.step, h5::ReadInt64Attr(root, "step"));
  CF_ASSIGN_OR_RETURN(ck.state.epoch, h5::ReadInt64Attr(root, "epoch"));
  CF_ASSIGN_OR_RETURN(ck.state.samples_seen, h5::ReadInt64Attr(root, "samples_seen"));
  CF_ASSIGN_OR_RETURN(int64_t seed, h5::ReadInt64Attr(root, "rng_seed"));
  ck.state.rng_seed = uint64_t(seed);
  CF_ASSIGN_OR_RETURN(ck.state.optimizer, h5::ReadStringAttr(root, "optimizer"));
  CF_ASSIGN_OR_RETURN(std::string prov, h5::ReadStringAttr(root, "provenance_json"));
  try {
    ck.provenance = nlohmann::json::parse(prov).get<std::map<std::string, std::string>>();
  } catch (const std::exception& e) {
    return DataLossError(path + ": unreadable provenance: " + e.what());
  }
  std::string calibration_json;
  if (version >= 2 && H5Aexists(root, "calibration_json") > 0) {
    CF_ASSIGN_OR_RETURN(calibration_json, h5::ReadStringAttr(root, "calibration_json"));
  }
  CF_ASSIGN_OR_RETURN(ck.weights, ReadTensors(root, "weights", path));
  CF_ASSIGN_OR_RETURN(ck.optimizer_state, ReadTensors(root, "optimizer", path));
  const std::string actual =
      Hex(PayloadChecksum(spec_json, calibration_json, ck.state, ck.weights, ck.optimizer_state));
  if (actual != *stored)
    return DataLossError(path + ": checksum mismatch (stored " + *stored + ", computed " + actual +
                         "): the checkpoint is corrupt");
  ck.checksum = actual;
  if (!calibration_json.empty()) {
    auto calibration = CalibrationFromJson(calibration_json, ck.spec);
    if (!calibration.ok()) return calibration.status().WithContext(path);
    ck.calibration = std::move(*calibration);
  }
  // The weights must be exactly the ones the spec needs (trainable and state tensors).
  int64_t n = 0;
  for (const auto& t : ck.weights) n += t.numel();
  const int64_t want = ck.spec.NumParameters() + ck.spec.NumStateValues();
  if (n != want)
    return FailedPreconditionError(path + ": weights hold " + std::to_string(n) + " values but spec '" +
                                   ck.spec.name + "' has " + std::to_string(want) + " parameters");
  return ck;
}

namespace {

std::string CheckpointName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%09" PRId64 ".h5", step);
  return buf;
}

// Checkpoint file names in `dir`, newest (largest step) first.
std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() == 17 && n.compare(0, 5, "ckpt-") == 0 && n.compare(14, 3, ".h5") == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.rbegin(), names.rend());
  return names;
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << content;
    if (!out) return InternalError(path + ": cannot write");
  }
  CF_RETURN_IF_ERROR(h5::FsyncPath(tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return InternalError(path + ": cannot rename into place");
  return h5::FsyncPath(h5::DirName(path));
}

}  // namespace

StatusOr<std::string> SaveCheckpointToDir(const std::string& dir, const Checkpoint& ckpt, int keep_last) {
  if (keep_last < 1) return InvalidArgumentError("keep_last must be at least 1");
  ::mkdir(dir.c_str(), 0755);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return NotFoundError(dir + ": cannot create checkpoint directory");
  const std::string name = CheckpointName(ckpt.state.step);
  const std::string path = dir + "/" + name;
  CF_RETURN_IF_ERROR(WriteCheckpoint(path, ckpt).status());
  CF_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kLatestName, name + "\n"));
  auto names = ListCheckpoints(dir);
  for (size_t i = keep_last; i < names.size(); ++i) std::remove((dir + "/" + names[i]).c_str());
  return path;
}

StatusOr<std::string> FindLatestCheckpoint(const std::string& dir) {
  std::vector<std::string> candidates;
  std::ifstream latest(dir + "/" + kLatestName);
  std::string pointed;
  if (latest && std::getline(latest, pointed) && !pointed.empty()) candidates.push_back(pointed);
  for (const auto& n : ListCheckpoints(dir))
    if (n != pointed) candidates.push_back(n);
  for (const auto& n : candidates) {
    const std::string path = dir + "/" + n;
    auto ck = ReadCheckpoint(path);
    if (ck.ok()) return path;
    if (ck.status().code() != StatusCode::kNotFound) {
      CF_LOG(WARNING) << "skipping checkpoint " << path << ": " << ck.status().message();
    }
  }
  return NotFoundError(dir + ": no valid checkpoint");
}

namespace {

// The writer's pid if `name` is one of the temporary names WriteCheckpoint and WriteFileAtomic
// use, else 0.
int64_t TemporaryWriterPid(const std::string& name) {
  size_t prefix = 0;
  if (name.size() > 22 && name.compare(0, 5, "ckpt-") == 0 && name.compare(14, 8, ".h5.tmp.") == 0)
    prefix = 22;
  else if (name.compare(0, 11, "LATEST.tmp.") == 0)
    prefix = 11;
  if (prefix == 0 || name.size() == prefix || name.size() - prefix > 9) return 0;
  int64_t pid = 0;
  for (size_t i = prefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

bool ProcessIsAlive(int64_t pid) {
  // EPERM: it exists but belongs to someone else; only ESRCH proves it is gone.
  return ::kill(pid_t(pid), 0) == 0 || errno != ESRCH;
}

}  // namespace

std::vector<TemporaryCheckpointFile> RemoveStaleTemporaryFiles(const std::string& dir) {
  std::vector<TemporaryCheckpointFile> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return found;
  while (dirent* e = ::readdir(d)) {
    const int64_t pid = TemporaryWriterPid(e->d_name);
    if (pid > 0) found.push_back({dir + "/" + e->d_name, pid, false, false});
  }
  ::closedir(d);
  for (auto& f : found) {
    f.writer_alive = ProcessIsAlive(f.writer_pid);
    if (!f.writer_alive) f.removed = ::unlink(f.path.c_str()) == 0;
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.path < b.path; });
  return found;
}

}  // namespace cosmoflow
