// Fuzz target: the dataset-shard reader above HDF5 (core/io/dataset.cc) and the single-cube reader
// (ReadHdf5Cube). As for checkpoints, libhdf5 is not fed raw bytes (it is known to crash on
// crafted files): the input writes well-formed HDF5 files whose contents it chooses (the rank,
// extents and element type of /cubes, /params, /params_unit and /sample/<name>; the schema name
// and version; attribute lists of any length, including none) and the target reads them back.
// Properties: no crash or sanitizer report; a shard the reader accepts has a cube shape and size
// that agree with its /cubes, reads every cube and parameter row it claims to hold, refuses the
// index past its end, and reads every sample field it lists with one value per cube; and no HDF5
// file or object is left open afterwards, whichever way the read went.
#include <hdf5.h>

#include <string>
#include <vector>

#include "core/io/dataset.h"
#include "core/io/h5.h"
#include "fuzz/fuzz_util.h"

using namespace cosmoflow;

namespace {

hid_t ElementType(uint8_t choice) {
  switch (choice % 5) {
    case 0: return H5T_NATIVE_INT16;
    case 1: return H5T_NATIVE_FLOAT;
    case 2: return H5T_NATIVE_INT32;
    case 3: return H5T_NATIVE_UINT8;
    default: return H5T_NATIVE_DOUBLE;
  }
}

// A dataset `name` under `loc` of the input's rank (0..max_rank), extents (0..5) and type, filled
// with the input's bytes (repeated); chunked with an unlimited first extent when the input says so.
void WriteArray(fuzz::Input& in, hid_t loc, const char* name, int max_rank) {
  const int rank = in.Byte() % (max_rank + 1);
  std::vector<hsize_t> dims(rank), max_dims(rank);
  size_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    dims[i] = max_dims[i] = in.Byte() % 6;
    elements *= dims[i];
  }
  const hid_t type = ElementType(in.Byte());
  h5::Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (rank > 0 && (in.Byte() & 1)) {
    max_dims[0] = H5S_UNLIMITED;
    std::vector<hsize_t> chunk(dims);
    for (auto& c : chunk) c = c == 0 ? 1 : c;
    H5Pset_chunk(plist.get(), rank, chunk.data());
  }
  h5::Handle space(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), max_dims.data()),
                   H5Sclose);
  h5::Handle ds(H5Dcreate2(loc, name, type, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return;
  if (rank == 0) elements = 1;
  std::vector<uint8_t> bytes(elements * H5Tget_size(type));
  for (auto& b : bytes) b = in.Byte();
  if (!bytes.empty()) H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
}

std::vector<std::string> Strings(fuzz::Input& in, const std::vector<std::string>& usual) {
  if (in.Byte() & 1) return usual;
  std::vector<std::string> v(in.Byte() % 5);
  for (auto& s : v) s = std::string(in.Bytes(12));
  return v;
}

void WriteAttributes(fuzz::Input& in, hid_t root, std::vector<std::string>* fields) {
  if (in.Byte() % 8) (void)h5::WriteStringAttr(root, "schema", in.Byte() % 4 ? "cosmoflow-dataset" : "other");
  if (in.Byte() % 8) (void)h5::WriteInt64Attr(root, "schema_version", in.Byte() % 4 ? 1 : int64_t(in.U32()));
  if (in.Byte() % 8)
    (void)h5::WriteStringListAttr(root, "param_names", Strings(in, {"Omega_M", "sigma_8", "n_s"}));
  if (in.Byte() % 8) (void)h5::WriteStringListAttr(root, "param_units", Strings(in, {"", "", ""}));
  if (in.Byte() % 8) {
    std::vector<double> z(in.Byte() % 5);
    for (auto& v : z) v = in.Double();
    (void)h5::WriteDoubleListAttr(root, "redshifts", z);
  }
  if (in.Byte() % 8) (void)h5::WriteDoubleListAttr(root, "box_size_mpc_h", {in.Double()});
  if (in.Byte() % 8) (void)h5::WriteStringAttr(root, "generator", std::string(in.Bytes(16)));
  if (in.Byte() & 1) {
    *fields = Strings(in, {"box_size_mpc_h", "group"});
    (void)h5::WriteStringListAttr(root, "sample_fields", *fields);
  }
}

void WriteShard(fuzz::Input& in, const std::string& path, std::vector<std::string>* fields) {
  h5::Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  FUZZ_CHECK(file.valid());
  WriteAttributes(in, file.get(), fields);
  if (in.Byte() % 8) WriteArray(in, file.get(), "cubes", 6);
  if (in.Byte() % 8) WriteArray(in, file.get(), "params", 3);
  if (in.Byte() & 1) WriteArray(in, file.get(), "params_unit", 3);
  if (in.Byte() & 1) {
    h5::Handle group(H5Gcreate2(file.get(), "sample", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (const std::string& name : *fields)
      if (group.valid() && !name.empty() && name.find('/') == std::string::npos && name != "." && (in.Byte() % 4))
        WriteArray(in, group.get(), name.c_str(), 2);
  }
}

void CheckAcceptedShard(const DatasetReader& r) {
  const DatasetInfo& info = r.info();
  const int64_t n = r.size();
  FUZZ_CHECK(n >= 0);
  std::vector<int16_t> cube(size_t(info.shape.elements()));
  for (int64_t i = 0; i < n; ++i) {
    FUZZ_CHECK(r.ReadCubeInto(i, cube.data()).ok());
    auto params = r.ReadParams(i);
    FUZZ_CHECK(params.ok() && params->size() == info.param_names.size());
  }
  FUZZ_CHECK(!r.ReadCubeInto(n, cube.data()).ok());
  FUZZ_CHECK(!r.ReadCubeInto(-1, cube.data()).ok());
  auto all = r.ReadAllParams();
  FUZZ_CHECK(all.ok() && all->size() == size_t(n) * info.param_names.size());
  if (info.has_unit_params) (void)r.ReadAllUnitParams();
  for (const std::string& name : info.sample_fields) {
    auto values = r.ReadSampleField(name);
    FUZZ_CHECK(values.ok() && values->size() == size_t(n));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::lock_guard<std::recursive_mutex> lock(h5::Lock());
  h5::SilenceErrors();
  fuzz::Input in(data, size);
  const std::string& path = fuzz::ScratchPath(".h5");
  std::vector<std::string> fields;
  WriteShard(in, path, &fields);
  {
    auto reader = DatasetReader::Open(path);
    if (reader.ok()) CheckAcceptedShard(**reader);
    (void)ReadHdf5Cube(path, "/cubes", in.Byte() % 3);
  }
  // Every path, accepted or refused, closes what it opened: no HDF5 file or object stays open.
  FUZZ_CHECK(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0);
  return 0;
}
