#include "synth/subcubes.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/io/dataset.h"

namespace cosmoflow {
namespace synth {

void CutSubcube(const Cube& parent, int side, int q, Cube* dst) {
  const CubeShape& ps = parent.shape();
  const int n = ps.width, m = n / side;
  const int i = q / (m * m), j = (q / m) % m, k = q % m;
  *dst = Cube(CubeShape{ps.channels, side, side, side}, DType::kInt16);
  const int16_t* src = parent.int16_data();
  int16_t* out = dst->int16_data();
  for (int c = 0; c < ps.channels; ++c) {
    for (int d = 0; d < side; ++d) {
      for (int h = 0; h < side; ++h) {
        const int64_t from = ((int64_t{c} * n + i * side + d) * n + j * side + h) * n + k * side;
        const int64_t to = ((int64_t{c} * side + d) * side + h) * side;
        std::memcpy(out + to, src + from, side * sizeof(int16_t));
      }
    }
  }
}

Status BinCube(const Cube& parent, int bin, Cube* dst) {
  const CubeShape& ps = parent.shape();
  const int n = ps.width, nb = n / bin;
  std::vector<int32_t> sum(static_cast<size_t>(ps.channels) * nb * nb * nb, 0);
  const int16_t* src = parent.int16_data();
  for (int c = 0; c < ps.channels; ++c)
    for (int d = 0; d < n; ++d)
      for (int h = 0; h < n; ++h) {
        int32_t* row = sum.data() + ((int64_t{c} * nb + d / bin) * nb + h / bin) * nb;
        const int16_t* in = src + ((int64_t{c} * n + d) * n + h) * n;
        for (int w = 0; w < n; ++w) row[w / bin] += in[w];
      }
  *dst = Cube(CubeShape{ps.channels, nb, nb, nb}, DType::kInt16);
  int16_t* out = dst->int16_data();
  for (size_t v = 0; v < sum.size(); ++v) {
    if (sum[v] > INT16_MAX || sum[v] < INT16_MIN) {
      return OutOfRangeError("a " + std::to_string(bin) + "^3 block sums to " +
                             std::to_string(sum[v]) + ", beyond int16");
    }
    out[v] = static_cast<int16_t>(sum[v]);
  }
  return Status::Ok();
}

namespace {

Status CheckOptions(const SubcubeOptions& o, const DatasetInfo& in) {
  const CubeShape& s = in.shape;
  if (s.depth != s.width || s.height != s.width)
    return InvalidArgumentError(o.in + ": cubes of shape " + s.ToString() + " are not cubic");
  if (o.bin < 1 || s.width % o.bin != 0) {
    return InvalidArgumentError("bin " + std::to_string(o.bin) + " does not divide the cube side " +
                                std::to_string(s.width));
  }
  const int coarse = s.width / o.bin;
  if (o.side < 1 || coarse % o.side != 0) {
    return InvalidArgumentError("sub-cube side " + std::to_string(o.side) +
                                " does not divide the cube side " + std::to_string(coarse) +
                                (o.bin > 1 ? " (after bin " + std::to_string(o.bin) + ")" : ""));
  }
  if (o.parents_per_shard < 1) return InvalidArgumentError("parents per shard must be >= 1");
  if (o.prefix.empty() || o.prefix.find('/') != std::string::npos)
    return InvalidArgumentError("prefix '" + o.prefix + "' must be a plain file name");
  return Status::Ok();
}

// The output's description: the input's, with the sub-cube shape, box and per-cube fields.
DatasetInfo SubcubeInfo(const SubcubeOptions& o, const DatasetInfo& in) {
  DatasetInfo info = in;
  const double scale = static_cast<double>(o.side) * o.bin / in.shape.width;
  info.shape = CubeShape{in.shape.channels, o.side, o.side, o.side};
  info.box_size_mpc_h = in.box_size_mpc_h * scale;
  info.sample_fields = {kSampleGroup, kSampleSubcube, kSampleBoxSize};
  info.generator = "cosmoflow-subcubes (from " + in.generator + ")";
  info.provenance =
      "cosmoflow-subcubes\ncommand: " + o.command_line + "\ninput: " + o.in +
      "\nvoxels summed in b^3 blocks, b = " + std::to_string(o.bin) +
      "\nsub-cube q = (i m + j) m + k of parent g holds coarsened voxels [i s, (i+1) s)"
      " x [j s, (j+1) s) x [k s, (k+1) s), s = " +
      std::to_string(o.side) + ", m = " + std::to_string(in.shape.width / o.bin / o.side) +
      "\ninput provenance:\n" + in.provenance;
  return info;
}

// Writes the sub-cubes of consecutive parents into shards of parents_per_shard parents.
class SubcubeWriter {
 public:
  SubcubeWriter(const SubcubeOptions& o, DatasetInfo info, SubcubeStats* stats)
      : o_(o),
        info_(std::move(info)),
        stats_(stats),
        single_(o.out.size() > 3 && o.out.substr(o.out.size() - 3) == ".h5") {
    write_options_.compression_level = o.compression_level;
  }

  // All sub-cubes of parent number `parent` (0-based in the input) with its labels and box.
  Status AddParent(int64_t parent, const Cube& universe, const std::vector<float>& params,
                   const std::vector<float>& unit, double box) {
    if (!writer_ || (!single_ && parent % o_.parents_per_shard == 0))
      CF_RETURN_IF_ERROR(Open(parent));
    Cube binned;
    if (o_.bin > 1) {
      CF_RETURN_IF_ERROR(BinCube(universe, o_.bin, &binned)
                             .WithContext(o_.in + ": universe " + std::to_string(parent)));
    }
    const Cube& cube = o_.bin > 1 ? binned : universe;
    const int m = cube.shape().width / o_.side;
    Cube sub;
    for (int q = 0; q < m * m * m; ++q) {
      CutSubcube(cube, o_.side, q, &sub);
      const std::vector<double> fields = {static_cast<double>(o_.group_offset + parent),
                                          static_cast<double>(q),
                                          box * o_.side / cube.shape().width};
      CF_RETURN_IF_ERROR(writer_->Append(sub, params, unit, fields).WithContext(path_));
      ++stats_->subcubes;
    }
    ++stats_->parents;
    return Status::Ok();
  }

  Status Close() {
    if (!writer_) return Status::Ok();
    CF_RETURN_IF_ERROR(writer_->Close().WithContext(path_));
    stats_->shards.push_back(path_);
    writer_.reset();
    return Status::Ok();
  }

 private:
  Status Open(int64_t parent) {
    CF_RETURN_IF_ERROR(Close());
    if (single_) {
      path_ = o_.out;
    } else {
      std::error_code ec;
      std::filesystem::create_directories(o_.out, ec);
      if (ec) return FailedPreconditionError(o_.out + ": cannot create directory: " + ec.message());
      char name[32];
      std::snprintf(name, sizeof(name), "-%08lld.h5",
                    static_cast<long long>(o_.group_offset + parent));
      path_ = o_.out + "/" + o_.prefix + name;
    }
    CF_ASSIGN_OR_RETURN(writer_, DatasetWriter::Create(path_, info_, write_options_));
    return Status::Ok();
  }

  const SubcubeOptions& o_;
  const DatasetInfo info_;
  SubcubeStats* stats_;
  const bool single_;
  DatasetWriteOptions write_options_;
  std::unique_ptr<DatasetWriter> writer_;
  std::string path_;
};

// Each cube's own box side: /sample/box_size_mpc_h when the shard has it, else the attribute.
StatusOr<std::vector<double>> ParentBoxes(const DatasetReader& shard) {
  const auto& fields = shard.info().sample_fields;
  for (const auto& f : fields)
    if (f == kSampleBoxSize) return shard.ReadSampleField(kSampleBoxSize);
  return std::vector<double>(shard.size(), shard.info().box_size_mpc_h);
}

}  // namespace

Status CutSubcubes(const SubcubeOptions& o, SubcubeStats* stats) {
  *stats = SubcubeStats();
  CF_ASSIGN_OR_RETURN(auto dataset, Dataset::Open(o.in));
  CF_RETURN_IF_ERROR(CheckOptions(o, dataset->info()));
  SubcubeWriter writer(o, SubcubeInfo(o, dataset->info()), stats);
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  int64_t parent = 0;
  for (int s = 0; s < dataset->num_shards(); ++s) {
    const DatasetReader& shard = dataset->shard(s);
    const size_t p = shard.info().param_names.size();
    CF_ASSIGN_OR_RETURN(std::vector<float> params, shard.ReadAllParams());
    std::vector<float> unit;
    if (shard.info().has_unit_params) {
      CF_ASSIGN_OR_RETURN(unit, shard.ReadAllUnitParams());
    }
    CF_ASSIGN_OR_RETURN(std::vector<double> boxes, ParentBoxes(shard));
    for (int64_t i = 0; i < shard.size(); ++i, ++parent) {
      CF_ASSIGN_OR_RETURN(Cube cube, shard.ReadCube(i));
      const std::vector<float> row(params.begin() + i * p, params.begin() + (i + 1) * p);
      const std::vector<float> urow =
          unit.empty() ? std::vector<float>()
                       : std::vector<float>(unit.begin() + i * p, unit.begin() + (i + 1) * p);
      CF_RETURN_IF_ERROR(writer.AddParent(parent, cube, row, urow, boxes[i]));
      const auto now = std::chrono::steady_clock::now();
      if (o.progress && std::chrono::duration<double>(now - last).count() > 2.0) {
        last = now;
        const double t = std::chrono::duration<double>(now - start).count();
        std::fprintf(stderr,
                     "cosmoflow-subcubes: %lld/%lld universes, %.1f universes/s, ETA %.0f s\n",
                     static_cast<long long>(parent + 1), static_cast<long long>(dataset->size()),
                     (parent + 1) / t, (dataset->size() - parent - 1) * t / (parent + 1));
      }
    }
  }
  return writer.Close();
}

}  // namespace synth
}  // namespace cosmoflow
