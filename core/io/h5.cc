#include "core/io/h5.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

namespace cosmoflow::h5 {

std::recursive_mutex& Lock() {
  static std::recursive_mutex mu;
  return mu;
}

void SilenceErrors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

StatusOr<Handle> OpenFile(const std::string& path) {
  SilenceErrors();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return NotFoundError(path + ": no such file");
  if (S_ISDIR(st.st_mode)) return InvalidArgumentError(path + ": is a directory, not an HDF5 file");
  if (H5Fis_hdf5(path.c_str()) <= 0)
    return InvalidArgumentError(path + ": not an HDF5 file (or its superblock is damaged)");
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return DataLossError(path + ": HDF5 cannot open the file (truncated or corrupt?)");
  return Handle(f, H5Fclose);
}

StatusOr<Handle> CreateFile(const std::string& path) {
  SilenceErrors();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return NotFoundError(path + ": cannot create HDF5 file");
  return Handle(f, H5Fclose);
}

bool Exists(hid_t loc, const std::string& name) {
  return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
}

StatusOr<Handle> OpenDataset(hid_t file, const std::string& name, const std::string& file_path) {
  // H5Lexists fails on intermediate missing groups; check each component.
  std::string partial;
  size_t pos = 0;
  while (pos <= name.size()) {
    size_t slash = name.find('/', pos);
    partial = name.substr(0, slash);
    if (!partial.empty() && partial != "/" && !Exists(file, partial))
      return NotFoundError(file_path + ": no dataset '" + name + "'");
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (d < 0) return NotFoundError(file_path + ": '" + name + "' is not a dataset");
  return Handle(d, H5Dclose);
}

std::vector<hsize_t> Dims(hid_t dataset) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) return {};
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

namespace {

Handle StringType() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return Handle(t, H5Tclose);
}

Status WriteAttr(hid_t obj, const std::string& name, hid_t type, hid_t space, const void* data) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle a(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  // An empty list has a NULL dataspace: nothing to write (H5Awrite refuses a null buffer).
  const bool empty = H5Sget_simple_extent_type(space) == H5S_NULL;
  if (!a.valid() || (!empty && H5Awrite(a.get(), type, data) < 0))
    return InternalError("cannot write attribute '" + name + "'");
  return Status::Ok();
}

StatusOr<Handle> OpenAttr(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) <= 0) return NotFoundError("missing attribute '" + name + "'");
  Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.valid()) return DataLossError("cannot open attribute '" + name + "'");
  return a;
}

hssize_t AttrPoints(hid_t attr) {
  Handle space(H5Aget_space(attr), H5Sclose);
  return H5Sget_simple_extent_npoints(space.get());
}

}  // namespace

Status WriteStringAttr(hid_t obj, const std::string& name, const std::string& value) {
  Handle type = StringType();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  const char* p = value.c_str();
  return WriteAttr(obj, name, type.get(), space.get(), &p);
}

Status WriteStringListAttr(hid_t obj, const std::string& name, const std::vector<std::string>& values) {
  Handle type = StringType();
  hsize_t n = values.size();
  Handle space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  return WriteAttr(obj, name, type.get(), space.get(), ptrs.data());
}

Status WriteInt64Attr(hid_t obj, const std::string& name, int64_t value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  return WriteAttr(obj, name, H5T_NATIVE_INT64, space.get(), &value);
}

Status WriteDoubleListAttr(hid_t obj, const std::string& name, const std::vector<double>& values) {
  hsize_t n = values.size();
  Handle space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  return WriteAttr(obj, name, H5T_NATIVE_DOUBLE, space.get(), values.data());
}

StatusOr<std::vector<std::string>> ReadStringListAttr(hid_t obj, const std::string& name) {
  CF_ASSIGN_OR_RETURN(Handle a, OpenAttr(obj, name));
  Handle ftype(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    return InvalidArgumentError("attribute '" + name + "' is not a string");
  hssize_t n = AttrPoints(a.get());
  if (n <= 0) return std::vector<std::string>{};
  std::vector<std::string> out;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Handle type = StringType();  // same character set as the file, or HDF5 refuses the conversion
    H5Tset_cset(type.get(), H5Tget_cset(ftype.get()));
    std::vector<char*> ptrs(n, nullptr);
    if (H5Aread(a.get(), type.get(), ptrs.data()) < 0)
      return DataLossError("cannot read attribute '" + name + "'");
    for (auto* p : ptrs) out.emplace_back(p ? p : "");
    Handle space(H5Aget_space(a.get()), H5Sclose);
    H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, ptrs.data());
  } else {  // fixed-length strings (e.g. written by h5py with dtype 'S')
    size_t len = H5Tget_size(ftype.get());
    std::vector<char> buf(len * n);
    if (H5Aread(a.get(), ftype.get(), buf.data()) < 0)
      return DataLossError("cannot read attribute '" + name + "'");
    for (hssize_t i = 0; i < n; ++i) {
      std::string s(buf.data() + i * len, len);
      s.erase(s.find_last_not_of('\0') + 1);
      out.push_back(s);
    }
  }
  return out;
}

StatusOr<std::string> ReadStringAttr(hid_t obj, const std::string& name) {
  CF_ASSIGN_OR_RETURN(auto list, ReadStringListAttr(obj, name));
  if (list.size() != 1) return InvalidArgumentError("attribute '" + name + "' is not a single string");
  return list[0];
}

StatusOr<int64_t> ReadInt64Attr(hid_t obj, const std::string& name) {
  CF_ASSIGN_OR_RETURN(Handle a, OpenAttr(obj, name));
  if (AttrPoints(a.get()) != 1) return InvalidArgumentError("attribute '" + name + "' is not a scalar");
  Handle ftype(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_INTEGER)
    return InvalidArgumentError("attribute '" + name + "' is not an integer");
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return DataLossError("cannot read attribute '" + name + "'");
  return v;
}

StatusOr<std::vector<double>> ReadDoubleListAttr(hid_t obj, const std::string& name) {
  CF_ASSIGN_OR_RETURN(Handle a, OpenAttr(obj, name));
  Handle ftype(H5Aget_type(a.get()), H5Tclose);
  H5T_class_t cls = H5Tget_class(ftype.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    return InvalidArgumentError("attribute '" + name + "' is not numeric");
  hssize_t n = AttrPoints(a.get());
  std::vector<double> v(n > 0 ? n : 0);
  if (n > 0 && H5Aread(a.get(), H5T_NATIVE_DOUBLE, v.data()) < 0)
    return DataLossError("cannot read attribute '" + name + "'");
  return v;
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return InternalError(path + ": cannot open for fsync");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return InternalError(path + ": fsync failed");
  return Status::Ok();
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace cosmoflow::h5
