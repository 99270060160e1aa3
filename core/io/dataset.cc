#include "core/io/dataset.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/io/h5.h"

namespace cosmoflow {

using h5::Handle;
using Guard = std::lock_guard<std::recursive_mutex>;

namespace {

constexpr char kSchemaName[] = "cosmoflow-dataset";

// Extends a 2-D [N, P] float dataset by one row and writes it.
Status AppendRow(hid_t ds, int64_t row, const std::vector<float>& values) {
  hsize_t p = values.size();
  hsize_t new_dims[2] = {hsize_t(row + 1), p};
  if (H5Dset_extent(ds, new_dims) < 0) return InternalError("cannot extend params");
  Handle fspace(H5Dget_space(ds), H5Sclose);
  hsize_t start[2] = {hsize_t(row), 0}, count[2] = {1, p};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  Handle mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
  if (H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, values.data()) < 0)
    return InternalError("cannot write params");
  return Status::Ok();
}

StatusOr<Handle> CreateParams(hid_t file, const char* name, hsize_t p) {
  hsize_t dims[2] = {0, p}, maxdims[2] = {H5S_UNLIMITED, p}, chunk[2] = {1024, p};
  Handle space(H5Screate_simple(2, dims, maxdims), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 2, chunk);
  Handle ds(H5Dcreate2(file, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (!ds.valid()) return InternalError(std::string("cannot create ") + name);
  return ds;
}

// A 1-D [N] float64 dataset of per-cube values, /sample/<name>.
StatusOr<Handle> CreateSampleField(hid_t group, const std::string& name) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {1024};
  Handle space(H5Screate_simple(1, dims, maxdims), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 1, chunk);
  Handle ds(H5Dcreate2(group, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
  if (!ds.valid()) return InternalError("cannot create /sample/" + name);
  return ds;
}

Status AppendValue(hid_t ds, int64_t row, double value) {
  hsize_t new_dims[1] = {hsize_t(row + 1)};
  if (H5Dset_extent(ds, new_dims) < 0) return InternalError("cannot extend a /sample field");
  Handle fspace(H5Dget_space(ds), H5Sclose);
  hsize_t start[1] = {hsize_t(row)}, count[1] = {1};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  Handle mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
  if (H5Dwrite(ds, H5T_NATIVE_DOUBLE, mspace.get(), fspace.get(), H5P_DEFAULT, &value) < 0)
    return InternalError("cannot write a /sample field");
  return Status::Ok();
}

Status CheckSampleFieldNames(const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty() || names[i].find('/') != std::string::npos || names[i] == ".")
      return InvalidArgumentError("sample field '" + names[i] + "' is not a plain name");
    for (size_t j = 0; j < i; ++j)
      if (names[j] == names[i]) return InvalidArgumentError("sample field '" + names[i] + "' given twice");
  }
  return Status::Ok();
}

// Creates /sample and one dataset per name; records the names in the attribute sample_fields.
Status CreateSampleFields(hid_t file, const std::vector<std::string>& names, std::vector<Handle>* out) {
  if (names.empty()) return Status::Ok();
  Handle group(H5Gcreate2(file, "sample", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!group.valid()) return InternalError("cannot create /sample");
  for (const auto& name : names) {
    CF_ASSIGN_OR_RETURN(Handle ds, CreateSampleField(group.get(), name));
    out->push_back(std::move(ds));
  }
  return h5::WriteStringListAttr(file, "sample_fields", names);
}

}  // namespace

// ---------------------------------------------------------------- writer

struct DatasetWriter::Impl {
  std::string path, tmp_path;
  DatasetInfo info;
  Handle file, cubes, params, unit_params;
  std::vector<Handle> sample_fields;  // /sample/<name>, in info.sample_fields order
  bool closed = false;
};

StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(const std::string& path,
                                                               const DatasetInfo& info,
                                                               const DatasetWriteOptions& options) {
  Guard lock(h5::Lock());
  CF_RETURN_IF_ERROR(info.shape.Validate().WithContext(path));
  if (info.param_names.empty()) return InvalidArgumentError(path + ": dataset needs at least one parameter name");
  if (!info.param_units.empty() && info.param_units.size() != info.param_names.size())
    return InvalidArgumentError(path + ": param_units has " + std::to_string(info.param_units.size()) +
                                " entries for " + std::to_string(info.param_names.size()) + " parameters");
  if (!info.redshifts.empty() && int(info.redshifts.size()) != info.shape.channels)
    return InvalidArgumentError(path + ": " + std::to_string(info.redshifts.size()) + " redshifts for " +
                                std::to_string(info.shape.channels) + " channels");
  if (options.compression_level < 0 || options.compression_level > 9)
    return InvalidArgumentError(path + ": compression level must be 0..9");
  CF_RETURN_IF_ERROR(CheckSampleFieldNames(info.sample_fields).WithContext(path));

  std::unique_ptr<DatasetWriter> w(new DatasetWriter());
  w->impl_ = std::make_unique<Impl>();
  Impl& im = *w->impl_;
  im.path = path;
  im.tmp_path = path + ".tmp." + std::to_string(::getpid());
  im.info = info;
  if (im.info.param_units.empty()) im.info.param_units.assign(info.param_names.size(), "");
  CF_ASSIGN_OR_RETURN(im.file, h5::CreateFile(im.tmp_path));

  const CubeShape& s = info.shape;
  hsize_t dims[5] = {0, hsize_t(s.channels), hsize_t(s.depth), hsize_t(s.height), hsize_t(s.width)};
  hsize_t maxdims[5] = {H5S_UNLIMITED, dims[1], dims[2], dims[3], dims[4]};
  hsize_t chunk[5] = {1, dims[1], dims[2], dims[3], dims[4]};  // one cube per chunk
  Handle space(H5Screate_simple(5, dims, maxdims), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 5, chunk);
  if (options.compression_level > 0) {
    H5Pset_shuffle(dcpl.get());
    H5Pset_deflate(dcpl.get(), options.compression_level);
  }
  im.cubes = Handle(H5Dcreate2(im.file.get(), "cubes", H5T_STD_I16LE, space.get(), H5P_DEFAULT, dcpl.get(),
                               H5P_DEFAULT),
                    H5Dclose);
  if (!im.cubes.valid()) return InternalError(path + ": cannot create /cubes");
  CF_ASSIGN_OR_RETURN(im.params, CreateParams(im.file.get(), "params", info.param_names.size()));
  if (info.has_unit_params) {
    CF_ASSIGN_OR_RETURN(im.unit_params, CreateParams(im.file.get(), "params_unit", info.param_names.size()));
  }
  CF_RETURN_IF_ERROR(
      CreateSampleFields(im.file.get(), info.sample_fields, &im.sample_fields).WithContext(path));
  hid_t root = im.file.get();
  CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "schema", kSchemaName));
  CF_RETURN_IF_ERROR(h5::WriteInt64Attr(root, "schema_version", kDatasetSchemaVersion));
  CF_RETURN_IF_ERROR(h5::WriteStringListAttr(root, "param_names", info.param_names));
  CF_RETURN_IF_ERROR(h5::WriteStringListAttr(root, "param_units", im.info.param_units));
  CF_RETURN_IF_ERROR(h5::WriteDoubleListAttr(root, "redshifts", info.redshifts));
  CF_RETURN_IF_ERROR(h5::WriteDoubleListAttr(root, "box_size_mpc_h", {info.box_size_mpc_h}));
  CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "generator", info.generator));
  CF_RETURN_IF_ERROR(h5::WriteStringAttr(root, "provenance", info.provenance));
  return w;
}

DatasetWriter::~DatasetWriter() {
  if (impl_ && !impl_->closed) {
    Guard lock(h5::Lock());
    impl_->cubes.reset();
    impl_->params.reset();
    impl_->unit_params.reset();
    impl_->sample_fields.clear();
    impl_->file.reset();
    std::remove(impl_->tmp_path.c_str());
  }
}

Status DatasetWriter::Append(const Cube& cube, const std::vector<float>& params,
                             const std::vector<float>& unit_params,
                             const std::vector<double>& sample_values) {
  Guard lock(h5::Lock());
  Impl& im = *impl_;
  if (im.closed) return FailedPreconditionError(im.path + ": append after Close()");
  if (cube.dtype() != DType::kInt16)
    return InvalidArgumentError(im.path + ": datasets store int16 counts, got a " + DTypeName(cube.dtype()) + " cube");
  if (cube.shape() != im.info.shape)
    return InvalidArgumentError(im.path + ": cube of shape " + cube.shape().ToString() +
                                " does not match the dataset's " + im.info.shape.ToString());
  if (params.size() != im.info.param_names.size())
    return InvalidArgumentError(im.path + ": " + std::to_string(params.size()) + " parameter values for " +
                                std::to_string(im.info.param_names.size()) + " names");
  if (im.info.has_unit_params != !unit_params.empty() ||
      (!unit_params.empty() && unit_params.size() != params.size()))
    return InvalidArgumentError(im.path + ": unit parameter values do not match the dataset's layout");
  for (float v : params)
    if (!std::isfinite(v)) return InvalidArgumentError(im.path + ": non-finite parameter value");
  if (sample_values.size() != im.info.sample_fields.size())
    return InvalidArgumentError(im.path + ": " + std::to_string(sample_values.size()) + " per-cube values for " +
                                std::to_string(im.info.sample_fields.size()) + " sample fields");

  const CubeShape& s = im.info.shape;
  hsize_t new_dims[5] = {hsize_t(count_ + 1), hsize_t(s.channels), hsize_t(s.depth), hsize_t(s.height),
                         hsize_t(s.width)};
  if (H5Dset_extent(im.cubes.get(), new_dims) < 0) return InternalError(im.path + ": cannot extend /cubes");
  Handle fspace(H5Dget_space(im.cubes.get()), H5Sclose);
  hsize_t start[5] = {hsize_t(count_), 0, 0, 0, 0};
  hsize_t count[5] = {1, new_dims[1], new_dims[2], new_dims[3], new_dims[4]};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  Handle mspace(H5Screate_simple(5, count, nullptr), H5Sclose);
  if (H5Dwrite(im.cubes.get(), H5T_NATIVE_INT16, mspace.get(), fspace.get(), H5P_DEFAULT, cube.raw()) < 0)
    return InternalError(im.path + ": cannot write cube " + std::to_string(count_));
  CF_RETURN_IF_ERROR(AppendRow(im.params.get(), count_, params).WithContext(im.path));
  if (im.info.has_unit_params)
    CF_RETURN_IF_ERROR(AppendRow(im.unit_params.get(), count_, unit_params).WithContext(im.path));
  for (size_t f = 0; f < sample_values.size(); ++f)
    CF_RETURN_IF_ERROR(AppendValue(im.sample_fields[f].get(), count_, sample_values[f]).WithContext(im.path));
  ++count_;
  return Status::Ok();
}

Status DatasetWriter::Close() {
  Guard lock(h5::Lock());
  Impl& im = *impl_;
  if (im.closed) return Status::Ok();
  im.cubes.reset();
  im.params.reset();
  im.unit_params.reset();
  im.sample_fields.clear();
  if (H5Fflush(im.file.get(), H5F_SCOPE_GLOBAL) < 0) return InternalError(im.path + ": flush failed");
  im.file.reset();
  CF_RETURN_IF_ERROR(h5::FsyncPath(im.tmp_path));
  if (std::rename(im.tmp_path.c_str(), im.path.c_str()) != 0)
    return InternalError(im.path + ": cannot rename temporary file into place");
  CF_RETURN_IF_ERROR(h5::FsyncPath(h5::DirName(im.path)));
  im.closed = true;
  return Status::Ok();
}

// ---------------------------------------------------------------- reader

namespace {

// The per-cube fields named by the attribute sample_fields (none without it), each [n].
Status OpenSampleFields(hid_t root, const std::string& path, hsize_t n, std::vector<std::string>* names,
                        std::vector<Handle>* datasets) {
  auto list = h5::ReadStringListAttr(root, "sample_fields");
  if (!list.ok()) return Status::Ok();
  *names = *list;
  for (const auto& name : *names) {
    CF_ASSIGN_OR_RETURN(Handle ds, h5::OpenDataset(root, "sample/" + name, path));
    auto dims = h5::Dims(ds.get());
    if (dims.size() != 1 || dims[0] != n)
      return InvalidArgumentError(path + ": /sample/" + name + " must be [" + std::to_string(n) + "]");
    datasets->push_back(std::move(ds));
  }
  return Status::Ok();
}

}  // namespace

struct DatasetReader::Impl {
  Handle file, cubes, params, unit_params;
  std::vector<Handle> sample_fields;  // in info.sample_fields order
};

StatusOr<std::unique_ptr<DatasetReader>> DatasetReader::Open(const std::string& path) {
  Guard lock(h5::Lock());
  std::unique_ptr<DatasetReader> r(new DatasetReader());
  r->impl_ = std::make_unique<Impl>();
  r->path_ = path;
  Impl& im = *r->impl_;
  CF_ASSIGN_OR_RETURN(im.file, h5::OpenFile(path));
  hid_t root = im.file.get();
  auto schema = h5::ReadStringAttr(root, "schema");
  if (!schema.ok() || *schema != kSchemaName)
    return InvalidArgumentError(path + ": not a CosmoFlow dataset shard (attribute schema='" +
                                std::string(kSchemaName) + "' missing)");
  CF_ASSIGN_OR_RETURN(int64_t version, h5::ReadInt64Attr(root, "schema_version"));
  if (version != kDatasetSchemaVersion)
    return FailedPreconditionError(path + ": dataset schema version " + std::to_string(version) +
                                   ", this build reads version " + std::to_string(kDatasetSchemaVersion));
  CF_ASSIGN_OR_RETURN(im.cubes, h5::OpenDataset(root, "cubes", path));
  CF_ASSIGN_OR_RETURN(im.params, h5::OpenDataset(root, "params", path));
  auto cdims = h5::Dims(im.cubes.get());
  if (cdims.size() != 5)
    return InvalidArgumentError(path + ": /cubes has rank " + std::to_string(cdims.size()) +
                                ", expected 5 [N, C, D, H, W]");
  {
    Handle t(H5Dget_type(im.cubes.get()), H5Tclose);
    if (H5Tget_class(t.get()) != H5T_INTEGER || H5Tget_size(t.get()) != 2)
      return InvalidArgumentError(path + ": /cubes must hold int16 counts");
  }
  DatasetInfo& info = r->info_;
  info.shape = {int(cdims[1]), int(cdims[2]), int(cdims[3]), int(cdims[4])};
  CF_RETURN_IF_ERROR(info.shape.Validate().WithContext(path));
  CF_ASSIGN_OR_RETURN(info.param_names, h5::ReadStringListAttr(root, "param_names"));
  auto units = h5::ReadStringListAttr(root, "param_units");
  info.param_units = units.ok() ? *units : std::vector<std::string>(info.param_names.size(), "");
  auto z = h5::ReadDoubleListAttr(root, "redshifts");
  if (z.ok()) info.redshifts = *z;
  auto box = h5::ReadDoubleListAttr(root, "box_size_mpc_h");
  if (box.ok() && box->size() == 1) info.box_size_mpc_h = (*box)[0];
  auto gen = h5::ReadStringAttr(root, "generator");
  if (gen.ok()) info.generator = *gen;
  auto prov = h5::ReadStringAttr(root, "provenance");
  if (prov.ok()) info.provenance = *prov;

  auto pdims = h5::Dims(im.params.get());
  if (pdims.size() != 2 || pdims[1] != info.param_names.size())
    return InvalidArgumentError(path + ": /params must be [N, " + std::to_string(info.param_names.size()) + "]");
  if (pdims[0] != cdims[0])
    return InvalidArgumentError(path + ": /cubes has " + std::to_string(cdims[0]) + " cubes but /params " +
                                std::to_string(pdims[0]) + " rows");
  if (h5::Exists(root, "params_unit")) {
    CF_ASSIGN_OR_RETURN(im.unit_params, h5::OpenDataset(root, "params_unit", path));
    auto udims = h5::Dims(im.unit_params.get());
    if (udims != pdims) return InvalidArgumentError(path + ": /params_unit does not match /params");
    info.has_unit_params = true;
  }
  CF_RETURN_IF_ERROR(OpenSampleFields(root, path, cdims[0], &info.sample_fields, &im.sample_fields));
  r->size_ = static_cast<int64_t>(cdims[0]);
  return r;
}

DatasetReader::~DatasetReader() {
  Guard lock(h5::Lock());
  impl_.reset();
}

Status DatasetReader::ReadCubeInto(int64_t index, int16_t* dst) const {
  if (index < 0 || index >= size_)
    return OutOfRangeError(path_ + ": cube index " + std::to_string(index) + " out of range [0, " +
                           std::to_string(size_) + ")");
  Guard lock(h5::Lock());
  const CubeShape& s = info_.shape;
  Handle fspace(H5Dget_space(impl_->cubes.get()), H5Sclose);
  hsize_t start[5] = {hsize_t(index), 0, 0, 0, 0};
  hsize_t count[5] = {1, hsize_t(s.channels), hsize_t(s.depth), hsize_t(s.height), hsize_t(s.width)};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  Handle mspace(H5Screate_simple(5, count, nullptr), H5Sclose);
  if (H5Dread(impl_->cubes.get(), H5T_NATIVE_INT16, mspace.get(), fspace.get(), H5P_DEFAULT, dst) < 0)
    return DataLossError(path_ + ": cannot read cube " + std::to_string(index) + " (truncated or corrupt file?)");
  return Status::Ok();
}

StatusOr<Cube> DatasetReader::ReadCube(int64_t index) const {
  Cube cube(info_.shape, DType::kInt16);
  CF_RETURN_IF_ERROR(ReadCubeInto(index, cube.int16_data()));
  return cube;
}

namespace {

Status ReadRows(hid_t ds, const std::string& path, int64_t first, int64_t rows, size_t p, float* dst) {
  Handle fspace(H5Dget_space(ds), H5Sclose);
  hsize_t start[2] = {hsize_t(first), 0}, count[2] = {hsize_t(rows), p};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  Handle mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, dst) < 0)
    return DataLossError(path + ": cannot read parameters (truncated or corrupt file?)");
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<float>> DatasetReader::ReadParams(int64_t index) const {
  if (index < 0 || index >= size_)
    return OutOfRangeError(path_ + ": sample index " + std::to_string(index) + " out of range [0, " +
                           std::to_string(size_) + ")");
  Guard lock(h5::Lock());
  std::vector<float> v(info_.param_names.size());
  CF_RETURN_IF_ERROR(ReadRows(impl_->params.get(), path_, index, 1, v.size(), v.data()));
  return v;
}

StatusOr<std::vector<float>> DatasetReader::ReadAllParams() const {
  Guard lock(h5::Lock());
  std::vector<float> v(size_ * info_.param_names.size());
  if (size_ > 0) CF_RETURN_IF_ERROR(ReadRows(impl_->params.get(), path_, 0, size_, info_.param_names.size(), v.data()));
  return v;
}

StatusOr<std::vector<float>> DatasetReader::ReadAllUnitParams() const {
  if (!info_.has_unit_params) return NotFoundError(path_ + ": no /params_unit in this shard");
  Guard lock(h5::Lock());
  std::vector<float> v(size_ * info_.param_names.size());
  if (size_ > 0)
    CF_RETURN_IF_ERROR(ReadRows(impl_->unit_params.get(), path_, 0, size_, info_.param_names.size(), v.data()));
  return v;
}

StatusOr<std::vector<double>> DatasetReader::ReadSampleField(const std::string& name) const {
  const auto& names = info_.sample_fields;
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) return NotFoundError(path_ + ": no per-cube field /sample/" + name);
  Guard lock(h5::Lock());
  std::vector<double> v(size_);
  if (size_ > 0 && H5Dread(impl_->sample_fields[it - names.begin()].get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
                           H5P_DEFAULT, v.data()) < 0)
    return DataLossError(path_ + ": cannot read /sample/" + name + " (truncated or corrupt file?)");
  return v;
}

// ---------------------------------------------------------------- multi-shard dataset

StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& file_or_dir) {
  struct stat st;
  if (::stat(file_or_dir.c_str(), &st) != 0) return NotFoundError(file_or_dir + ": no such file or directory");
  std::vector<std::string> files;
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(file_or_dir.c_str());
    if (!d) return NotFoundError(file_or_dir + ": cannot list directory");
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".h5") == 0) files.push_back(file_or_dir + "/" + name);
    }
    ::closedir(d);
    std::sort(files.begin(), files.end());
    if (files.empty()) return NotFoundError(file_or_dir + ": directory holds no .h5 shards");
  } else {
    files.push_back(file_or_dir);
  }
  std::unique_ptr<Dataset> ds(new Dataset());
  for (const auto& f : files) {
    CF_ASSIGN_OR_RETURN(auto reader, DatasetReader::Open(f));
    if (!ds->shards_.empty()) {
      const DatasetInfo& first = ds->shards_.front()->info();
      if (reader->info().shape != first.shape)
        return InvalidArgumentError(f + ": cubes of shape " + reader->info().shape.ToString() + " but " +
                                    ds->shards_.front()->path() + " has " + first.shape.ToString());
      if (reader->info().param_names != first.param_names)
        return InvalidArgumentError(f + ": parameter names differ from " + ds->shards_.front()->path());
    }
    ds->offsets_.push_back(ds->total_);
    ds->total_ += reader->size();
    ds->shards_.push_back(std::move(reader));
  }
  if (ds->total_ == 0) return NotFoundError(file_or_dir + ": dataset holds no samples");
  return ds;
}

Status Dataset::ReadCubeInto(int64_t index, int16_t* dst) const {
  if (index < 0 || index >= total_)
    return OutOfRangeError("sample index " + std::to_string(index) + " out of range [0, " + std::to_string(total_) + ")");
  int s = int(std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin()) - 1;
  return shards_[s]->ReadCubeInto(index - offsets_[s], dst);
}

StatusOr<Cube> Dataset::ReadCube(int64_t index) const {
  Cube cube(info().shape, DType::kInt16);
  CF_RETURN_IF_ERROR(ReadCubeInto(index, cube.int16_data()));
  return cube;
}

StatusOr<std::vector<float>> Dataset::ReadParams(int64_t index) const {
  if (index < 0 || index >= total_)
    return OutOfRangeError("sample index " + std::to_string(index) + " out of range [0, " + std::to_string(total_) + ")");
  int s = int(std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin()) - 1;
  return shards_[s]->ReadParams(index - offsets_[s]);
}

// ---------------------------------------------------------------- single cube from any HDF5 file

StatusOr<Cube> ReadHdf5Cube(const std::string& path, const std::string& dataset_path, int64_t index) {
  Guard lock(h5::Lock());
  CF_ASSIGN_OR_RETURN(Handle file, h5::OpenFile(path));
  CF_ASSIGN_OR_RETURN(Handle ds, h5::OpenDataset(file.get(), dataset_path, path));
  auto dims = h5::Dims(ds.get());
  const std::string where = path + ":" + dataset_path;
  if (dims.size() < 3 || dims.size() > 5)
    return InvalidArgumentError(where + " has rank " + std::to_string(dims.size()) +
                                "; a cube must be [N,C,D,H,W], [C,D,H,W] or [D,H,W]");
  Handle ftype(H5Dget_type(ds.get()), H5Tclose);
  DType dtype;
  hid_t mem_type;
  H5T_class_t cls = H5Tget_class(ftype.get());
  if (cls == H5T_INTEGER && H5Tget_size(ftype.get()) == 2) {
    dtype = DType::kInt16;
    mem_type = H5T_NATIVE_INT16;
  } else if (cls == H5T_FLOAT && H5Tget_size(ftype.get()) == 4) {
    dtype = DType::kFloat32;
    mem_type = H5T_NATIVE_FLOAT;
  } else {
    return InvalidArgumentError(where + ": unsupported element type (expected int16 or float32)");
  }
  const size_t r = dims.size();
  CubeShape shape{r >= 4 ? int(dims[r - 4]) : 1, int(dims[r - 3]), int(dims[r - 2]), int(dims[r - 1])};
  CF_RETURN_IF_ERROR(shape.Validate().WithContext(where));
  int64_t n = r == 5 ? int64_t(dims[0]) : 1;
  if (index < 0 || index >= n)
    return OutOfRangeError(where + ": index " + std::to_string(index) + " out of range [0, " + std::to_string(n) + ")");
  std::vector<hsize_t> start(r, 0), count(dims);
  if (r == 5) {
    start[0] = index;
    count[0] = 1;
  }
  Handle fspace(H5Dget_space(ds.get()), H5Sclose);
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  Handle mspace(H5Screate_simple(int(r), count.data(), nullptr), H5Sclose);
  Cube cube(shape, dtype);
  if (H5Dread(ds.get(), mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, cube.raw()) < 0)
    return DataLossError(where + ": cannot read data (truncated or corrupt file?)");
  return cube;
}

}  // namespace cosmoflow
