// cosmoflow-subcubes: universes -> sub-cubes with a group id per parent. See docs/data.md.
//
// Exit codes: 0 done (the shard paths on stdout), 1 a failure while reading or writing, 2 bad
// flags.
#include <cstdio>
#include <string>

#include "core/base/flags.h"
#include "synth/subcubes.h"

using namespace cosmoflow;
using namespace cosmoflow::synth;

namespace {

constexpr char kUsage[] =
    "usage: cosmoflow-subcubes --in SHARD|DIR --out DIR|FILE.h5 [options]\n"
    "Cuts each (C, n, n, n) universe into (n/(b s))^3 sub-cubes (C, s, s, s), all channels, with\n"
    "voxels summed in b^3 blocks first (--bin b), with the parent's labels and /sample/group "
    "(parent index), /sample/subcube and "
    "/sample/box_size_mpc_h.\n";

StatusOr<SubcubeOptions> ParseFlags(int argc, char** argv, bool* help) {
  SubcubeOptions o;
  int64_t side = 32, bin = 1, per_shard = 16, compress = 0, offset = 0;
  bool quiet = false;
  FlagParser flags;
  flags.AddString("in", &o.in, "input dataset: a shard or a directory of shards");
  flags.AddString("out", &o.out,
                  "output: a directory (shards <prefix>-<first parent>.h5) or FILE.h5");
  flags.AddInt("side", &side, "sub-cube side (default 32; must divide the cube side / bin)");
  flags.AddInt("bin", &bin,
               "sum each bin^3 block of voxels into one before cutting (default 1: none)");
  flags.AddInt("parents-per-shard", &per_shard, "universes per output shard (default 16)");
  flags.AddString("prefix", &o.prefix, "shard name prefix (default subcubes)");
  flags.AddInt("group-offset", &offset, "added to every group id (default 0)");
  flags.AddInt("compress", &compress, "HDF5 gzip level 0..9 (default 0)");
  flags.AddBool("quiet", &quiet, "no progress lines");
  flags.AddBool("help", help, "this text");
  Status s = flags.Parse(argc, argv, nullptr);
  if (*help) {
    std::printf("%s\n%s", kUsage, flags.Usage().c_str());
    return o;
  }
  CF_RETURN_IF_ERROR(s);
  if (o.in.empty() || o.out.empty()) return InvalidArgumentError("--in and --out are required");
  if (side < 1 || side > 1024) return InvalidArgumentError("--side must be in 1..1024");
  if (bin < 1 || bin > 1024) return InvalidArgumentError("--bin must be in 1..1024");
  if (per_shard < 1 || per_shard > 1000000)
    return InvalidArgumentError("--parents-per-shard must be in 1..1000000");
  if (compress < 0 || compress > 9) return InvalidArgumentError("--compress must be 0..9");
  if (offset < 0) return InvalidArgumentError("--group-offset must be >= 0");
  o.side = static_cast<int>(side);
  o.bin = static_cast<int>(bin);
  o.parents_per_shard = static_cast<int>(per_shard);
  o.compression_level = static_cast<int>(compress);
  o.group_offset = offset;
  o.progress = !quiet;
  o.command_line = JoinCommandLine(argc, argv);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  bool help = false;
  auto o = ParseFlags(argc, argv, &help);
  if (help) return 0;
  if (!o.ok()) {
    std::fprintf(stderr, "cosmoflow-subcubes: %s\n", o.status().message().c_str());
    return 2;
  }
  SubcubeStats stats;
  if (Status s = CutSubcubes(*o, &stats); !s.ok()) {
    std::fprintf(stderr, "cosmoflow-subcubes: %s\n", s.message().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::fprintf(stderr, "cosmoflow-subcubes: %lld universes -> %lld sub-cubes in %zu shards\n",
               static_cast<long long>(stats.parents), static_cast<long long>(stats.subcubes),
               stats.shards.size());
  for (const auto& shard : stats.shards) std::printf("%s\n", shard.c_str());
  return 0;
}
