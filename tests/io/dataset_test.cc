#include "core/io/dataset.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <functional>

#include <gtest/gtest.h>

#include "tests/common/files.h"

namespace cosmoflow {
namespace {

using testing::TempDir;

DatasetInfo Info(CubeShape shape) {
  DatasetInfo info;
  info.shape = shape;
  info.param_names = {"Omega_M", "sigma_8", "n_s"};
  info.redshifts.assign(shape.channels, 0.0);
  for (int c = 0; c < shape.channels; ++c) info.redshifts[c] = 0.5 * c;
  info.box_size_mpc_h = 32;
  info.generator = "dataset_test";
  info.provenance = "unit test";
  return info;
}

Cube Pattern(CubeShape shape, int seed) {
  Cube c(shape, DType::kInt16);
  for (int64_t i = 0; i < shape.elements(); ++i) c.int16_data()[i] = int16_t((i * 7 + seed * 13) % 50);
  return c;
}

std::vector<float> Params(int i) { return {0.25f + 0.01f * i, 0.8f + 0.001f * i, 0.9f + 0.002f * i}; }

Status WriteShard(const std::string& path, CubeShape shape, int n, int first = 0, int compression = 0) {
  CF_ASSIGN_OR_RETURN(auto w, DatasetWriter::Create(path, Info(shape), {compression}));
  for (int i = 0; i < n; ++i) CF_RETURN_IF_ERROR(w->Append(Pattern(shape, first + i), Params(first + i)));
  return w->Close();
}

TEST(DatasetTest, RoundTripWithAndWithoutCompression) {
  TempDir dir;
  const CubeShape shape{2, 8, 8, 8};
  for (int level : {0, 4}) {
    std::string path = dir / ("s" + std::to_string(level) + ".h5");
    ASSERT_TRUE(WriteShard(path, shape, 5, 0, level).ok());
    auto r = DatasetReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->size(), 5);
    const DatasetInfo& info = (*r)->info();
    EXPECT_EQ(info.shape, shape);
    EXPECT_EQ(info.param_names, (std::vector<std::string>{"Omega_M", "sigma_8", "n_s"}));
    EXPECT_EQ(info.redshifts, (std::vector<double>{0.0, 0.5}));
    EXPECT_EQ(info.box_size_mpc_h, 32);
    EXPECT_EQ(info.generator, "dataset_test");
    for (int i : {4, 0, 2}) {  // random access, any order
      auto c = (*r)->ReadCube(i);
      ASSERT_TRUE(c.ok());
      Cube want = Pattern(shape, i);
      EXPECT_EQ(0, std::memcmp(c->raw(), want.raw(), want.size_bytes())) << "cube " << i;
      auto p = (*r)->ReadParams(i);
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(*p, Params(i));
    }
    auto all = (*r)->ReadAllParams();
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->size(), 15u);
    EXPECT_EQ((*all)[3 * 3 + 1], Params(3)[1]);
  }
}

TEST(DatasetTest, UnitParamsRoundTrip) {
  TempDir dir;
  DatasetInfo info = Info({1, 4, 4, 4});
  info.has_unit_params = true;
  auto w = DatasetWriter::Create(dir / "u.h5", info);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(Pattern(info.shape, 0), Params(0), {-0.5f, 0.1f, 0.9f}).ok());
  // Missing unit values in a dataset that has them is refused.
  EXPECT_FALSE((*w)->Append(Pattern(info.shape, 1), Params(1)).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto r = DatasetReader::Open(dir / "u.h5");
  ASSERT_TRUE(r.ok());
  auto u = (*r)->ReadAllUnitParams();
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(*u, (std::vector<float>{-0.5f, 0.1f, 0.9f}));
}

TEST(DatasetTest, PerCubeSampleFieldsRoundTrip) {
  TempDir dir;
  DatasetInfo info = Info({1, 4, 4, 4});
  info.sample_fields = {kSampleBoxSize, kSampleGroup};
  auto w = DatasetWriter::Create(dir / "f.h5", info);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE((*w)->Append(Pattern(info.shape, i), Params(i), {}, {100.0 + i, 7.0 * i}).ok());
  // The wrong number of per-cube values is refused.
  EXPECT_FALSE((*w)->Append(Pattern(info.shape, 3), Params(3), {}, {1.0}).ok());
  EXPECT_FALSE((*w)->Append(Pattern(info.shape, 3), Params(3)).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto r = DatasetReader::Open(dir / "f.h5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->info().sample_fields, info.sample_fields);
  auto box = (*r)->ReadSampleField(kSampleBoxSize);
  ASSERT_TRUE(box.ok());
  EXPECT_EQ(*box, (std::vector<double>{100, 101, 102}));
  auto group = (*r)->ReadSampleField(kSampleGroup);
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(*group, (std::vector<double>{0, 7, 14}));
  auto missing = (*r)->ReadSampleField("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/sample/nope"), std::string::npos);
  // A shard without fields reads as before.
  ASSERT_TRUE(WriteShard(dir / "plain.h5", info.shape, 1).ok());
  auto plain = DatasetReader::Open(dir / "plain.h5");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->info().sample_fields.empty());
  // Names must be plain and distinct.
  for (const auto& bad : std::vector<std::vector<std::string>>{{"a/b"}, {""}, {"x", "x"}}) {
    DatasetInfo b = Info({1, 4, 4, 4});
    b.sample_fields = bad;
    EXPECT_FALSE(DatasetWriter::Create(dir / "bad.h5", b).ok());
  }
}

TEST(DatasetTest, DirectoryOfShardsMapsGlobalIndex) {
  TempDir dir;
  const CubeShape shape{1, 6, 6, 6};
  ASSERT_TRUE(WriteShard(dir / "a.h5", shape, 3, 0).ok());
  ASSERT_TRUE(WriteShard(dir / "b.h5", shape, 4, 3).ok());
  testing::WriteAll(dir / "notes.txt", "ignored");
  auto ds = Dataset::Open(dir.path());
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ((*ds)->size(), 7);
  EXPECT_EQ((*ds)->num_shards(), 2);
  for (int i = 0; i < 7; ++i) {
    auto c = (*ds)->ReadCube(i);
    ASSERT_TRUE(c.ok());
    Cube want = Pattern(shape, i);
    EXPECT_EQ(0, std::memcmp(c->raw(), want.raw(), want.size_bytes())) << i;
    EXPECT_EQ(*(*ds)->ReadParams(i), Params(i));
  }
  EXPECT_EQ((*ds)->ReadCube(7).status().code(), StatusCode::kOutOfRange);
}

TEST(DatasetTest, WriterNeverLeavesAHalfWrittenShard) {
  TempDir dir;
  {
    auto w = DatasetWriter::Create(dir / "x.h5", Info({1, 4, 4, 4}));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(Pattern({1, 4, 4, 4}, 0), Params(0)).ok());
    struct stat st;
    EXPECT_NE(::stat((dir / "x.h5").c_str(), &st), 0) << "final name must not exist before Close()";
  }  // destroyed without Close()
  struct stat st;
  EXPECT_NE(::stat((dir / "x.h5").c_str(), &st), 0);
  EXPECT_EQ(std::system(("test -z \"$(ls " + dir.path() + ")\"").c_str()), 0) << "temporary file left behind";
}

TEST(DatasetTest, WriterRejectsBadAppends) {
  TempDir dir;
  auto w = DatasetWriter::Create(dir / "w.h5", Info({1, 4, 4, 4}));
  ASSERT_TRUE(w.ok());
  auto s = (*w)->Append(Pattern({1, 4, 4, 5}, 0), Params(0));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1x4x4x5"), std::string::npos) << s.message();
  EXPECT_FALSE((*w)->Append(Cube({1, 4, 4, 4}, DType::kFloat32), Params(0)).ok());
  EXPECT_FALSE((*w)->Append(Pattern({1, 4, 4, 4}, 0), {1.f}).ok());
  EXPECT_FALSE((*w)->Append(Pattern({1, 4, 4, 4}, 0), {1.f, NAN, 1.f}).ok());
  DatasetInfo bad = Info({2, 4, 4, 4});
  bad.redshifts = {0.0};
  EXPECT_FALSE(DatasetWriter::Create(dir / "b.h5", bad).ok());
  EXPECT_FALSE(DatasetWriter::Create(dir / "c.h5", Info({1, 0, 4, 4})).ok());
}

// Writes an HDF5 file by hand to build broken shards.
void WriteRawH5(const std::string& path, const std::function<void(hid_t)>& body) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  body(f);
  H5Fclose(f);
}

void SchemaAttrs(hid_t f) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t sc = H5Screate(H5S_SCALAR);
  const char* v = "cosmoflow-dataset";
  hid_t a = H5Acreate2(f, "schema", t, sc, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, &v);
  H5Aclose(a);
  int64_t ver = 1;
  a = H5Acreate2(f, "schema_version", H5T_NATIVE_INT64, sc, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &ver);
  H5Aclose(a);
  const char* names[3] = {"Omega_M", "sigma_8", "n_s"};
  hsize_t three = 3;
  hid_t s3 = H5Screate_simple(1, &three, nullptr);
  a = H5Acreate2(f, "param_names", t, s3, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, names);
  H5Aclose(a);
  H5Sclose(s3);
  H5Sclose(sc);
  H5Tclose(t);
}

void Dataset(hid_t f, const char* name, hid_t type, std::vector<hsize_t> dims) {
  hid_t s = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(d);
  H5Sclose(s);
}

void ExpectError(const std::string& path, StatusCode code, const std::string& what) {
  auto r = DatasetReader::Open(path);
  ASSERT_FALSE(r.ok()) << path;
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
}

TEST(DatasetTest, BadShardsGiveClearErrors) {
  TempDir dir;
  ExpectError(dir / "missing.h5", StatusCode::kNotFound, "no such file");
  testing::WriteAll(dir / "text.h5", "this is not HDF5");
  ExpectError(dir / "text.h5", StatusCode::kInvalidArgument, "not an HDF5 file");
  WriteRawH5(dir / "noschema.h5", [](hid_t) {});
  ExpectError(dir / "noschema.h5", StatusCode::kInvalidArgument, "not a CosmoFlow dataset");
  WriteRawH5(dir / "nocubes.h5", [](hid_t f) {
    SchemaAttrs(f);
    Dataset(f, "params", H5T_NATIVE_FLOAT, {2, 3});
  });
  ExpectError(dir / "nocubes.h5", StatusCode::kNotFound, "no dataset 'cubes'");
  WriteRawH5(dir / "misnamed.h5", [](hid_t f) {
    SchemaAttrs(f);
    Dataset(f, "cube", H5T_NATIVE_INT16, {2, 1, 4, 4, 4});
    Dataset(f, "params", H5T_NATIVE_FLOAT, {2, 3});
  });
  ExpectError(dir / "misnamed.h5", StatusCode::kNotFound, "no dataset 'cubes'");
  WriteRawH5(dir / "rank4.h5", [](hid_t f) {
    SchemaAttrs(f);
    Dataset(f, "cubes", H5T_NATIVE_INT16, {2, 4, 4, 4});
    Dataset(f, "params", H5T_NATIVE_FLOAT, {2, 3});
  });
  ExpectError(dir / "rank4.h5", StatusCode::kInvalidArgument, "rank 4");
  WriteRawH5(dir / "f64.h5", [](hid_t f) {
    SchemaAttrs(f);
    Dataset(f, "cubes", H5T_NATIVE_DOUBLE, {2, 1, 4, 4, 4});
    Dataset(f, "params", H5T_NATIVE_FLOAT, {2, 3});
  });
  ExpectError(dir / "f64.h5", StatusCode::kInvalidArgument, "int16");
  WriteRawH5(dir / "rows.h5", [](hid_t f) {
    SchemaAttrs(f);
    Dataset(f, "cubes", H5T_NATIVE_INT16, {2, 1, 4, 4, 4});
    Dataset(f, "params", H5T_NATIVE_FLOAT, {3, 3});
  });
  ExpectError(dir / "rows.h5", StatusCode::kInvalidArgument, "3 rows");

  // Truncated: a valid shard cut in half.
  ASSERT_TRUE(WriteShard(dir / "good.h5", {1, 16, 16, 16}, 4).ok());
  std::string bytes = testing::ReadAll(dir / "good.h5");
  testing::WriteAll(dir / "trunc.h5", bytes.substr(0, bytes.size() / 2));
  auto r = DatasetReader::Open(dir / "trunc.h5");
  if (r.ok()) {  // the superblock may survive; then reading the lost cubes must fail cleanly
    bool any_error = false;
    for (int i = 0; i < (*r)->size(); ++i) any_error |= !(*r)->ReadCube(i).ok();
    EXPECT_TRUE(any_error) << "reading a truncated shard must report an error";
  } else {
    EXPECT_NE(r.status().message().find("trunc.h5"), std::string::npos);
  }
}

TEST(DatasetTest, MismatchedShardsAndRanges) {
  TempDir dir;
  ASSERT_TRUE(WriteShard(dir / "a.h5", {1, 4, 4, 4}, 2).ok());
  ASSERT_TRUE(WriteShard(dir / "b.h5", {1, 8, 8, 8}, 2).ok());
  auto ds = Dataset::Open(dir.path());
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("b.h5"), std::string::npos) << ds.status().message();
  EXPECT_NE(ds.status().message().find("1x8x8x8"), std::string::npos) << ds.status().message();

  TempDir empty;
  EXPECT_EQ(Dataset::Open(empty.path()).status().code(), StatusCode::kNotFound);

  auto r = DatasetReader::Open(dir / "a.h5");
  ASSERT_TRUE(r.ok());
  auto c = (*r)->ReadCube(2);
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(c.status().message().find("a.h5: cube index 2 out of range [0, 2)"), std::string::npos)
      << c.status().message();
  EXPECT_EQ((*r)->ReadCube(-1).status().code(), StatusCode::kOutOfRange);
}

TEST(Hdf5CubeTest, ReadsAnyRankAndType) {
  TempDir dir;
  std::vector<float> vals(2 * 3 * 4 * 4 * 4);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = float(i);
  WriteRawH5(dir / "f.h5", [&](hid_t f) {
    hsize_t dims[5] = {2, 3, 4, 4, 4};
    hid_t s = H5Screate_simple(5, dims, nullptr);
    hid_t g = H5Gcreate2(f, "grp", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t d = H5Dcreate2(g, "x", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals.data());
    H5Dclose(d);
    H5Gclose(g);
    H5Sclose(s);
    Dataset(f, "three", H5T_NATIVE_INT16, {4, 4, 4});
    Dataset(f, "two", H5T_NATIVE_INT16, {4, 4});
    Dataset(f, "f64", H5T_NATIVE_DOUBLE, {4, 4, 4});
  });
  auto c = ReadHdf5Cube(dir / "f.h5", "/grp/x", 1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->shape(), (CubeShape{3, 4, 4, 4}));
  EXPECT_EQ(c->dtype(), DType::kFloat32);
  EXPECT_EQ(c->float_data()[0], float(3 * 64));
  auto t = ReadHdf5Cube(dir / "f.h5", "three");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (CubeShape{1, 4, 4, 4}));
  EXPECT_EQ(ReadHdf5Cube(dir / "f.h5", "/grp/x", 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(ReadHdf5Cube(dir / "f.h5", "two").status().message().find("rank 2"), std::string::npos);
  EXPECT_NE(ReadHdf5Cube(dir / "f.h5", "f64").status().message().find("unsupported element type"),
            std::string::npos);
  EXPECT_EQ(ReadHdf5Cube(dir / "f.h5", "/nope/x").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace cosmoflow
