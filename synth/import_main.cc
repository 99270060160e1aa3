// cosmoflow-import: MLPerf HPC CosmoFlow TFRecords -> HDF5 dataset shards. See docs/data.md.
#include <cstdio>
#include <string>
#include <vector>

#include "core/base/flags.h"
#include "synth/importer.h"

using namespace cosmoflow;
using namespace cosmoflow::synth;

namespace {

constexpr char kUsage[] =
    "usage: cosmoflow-import --out DIR [options] FILE.tfrecord... | --files-from LIST\n"
    "Converts gzip (or plain) TFRecord files of the MLPerf HPC CosmoFlow dataset into HDF5 shards\n"
    "(cubes channel-first int16, params = physical labels, params_unit = unitPar).\n"
    "Exit status: 0 all imported, 1 error (nothing after it imported), 2 bad usage,\n"
    "3 finished but corrupt records were skipped (--skip-corrupt).\n";

// Parses argv into the import options and the input files. With --help, *usage gets the flag
// table and nothing is checked.
StatusOr<ImportOptions> ParseImportFlags(int argc, char** argv, std::vector<std::string>* files,
                                         std::string* usage) {
  std::string out, files_from, prefix, report;
  int64_t files_per_shard = 64, compress = 0, side = 128, first_file_number = 0;
  bool skip_corrupt = false, quiet = false, help = false;
  FlagParser flags;
  flags.AddString("out", &out, "output directory for shards (created if missing)");
  flags.AddString("files-from", &files_from, "read input paths from this file, one per line");
  flags.AddString("prefix", &prefix, "shard name prefix (default: the list's name, or 'mlperf')");
  flags.AddInt("files-per-shard", &files_per_shard, "input files per shard (default 64, ~1 GiB)");
  flags.AddInt("first-file-number", &first_file_number,
               "number of the first file in shard names (for split lists; default 0)");
  flags.AddInt("compress", &compress, "HDF5 gzip level 0..9 (default 0: none)");
  flags.AddBool("skip-corrupt", &skip_corrupt,
                "skip and report corrupt records instead of stopping");
  flags.AddString("report", &report,
                  "write a TSV line per record (imported/skipped, shard, index)");
  flags.AddInt("side", &side, "expected cube side (default 128)");
  flags.AddBool("quiet", &quiet, "no progress lines");
  flags.AddBool("help", &help, "this text");
  Status s = flags.Parse(argc, argv, files);
  if (help) {
    *usage = flags.Usage();
    return ImportOptions();
  }
  CF_RETURN_IF_ERROR(s);
  if (out.empty()) return InvalidArgumentError("--out DIR is required");
  if (!files_from.empty()) {
    CF_ASSIGN_OR_RETURN(std::vector<std::string> list, ReadFileList(files_from));
    files->insert(files->end(), list.begin(), list.end());
  }
  if (files->empty()) return InvalidArgumentError("no input files (give paths or --files-from)");
  if (side < 4 || side > 1024) return InvalidArgumentError("--side must be in 4..1024");
  if (files_per_shard < 1 || files_per_shard > 1000000) {
    return InvalidArgumentError("--files-per-shard must be in 1..1000000");
  }
  if (prefix.empty()) {
    prefix = "mlperf";
    if (!files_from.empty()) {
      std::string base = files_from.substr(files_from.find_last_of('/') + 1);
      base = base.substr(0, base.find('.'));
      if (!base.empty()) prefix = base;
    }
  }
  ImportOptions o;
  o.out_dir = out;
  o.prefix = prefix;
  o.files_per_shard = static_cast<int>(files_per_shard);
  o.compression_level = static_cast<int>(compress);
  o.skip_corrupt = skip_corrupt;
  o.side = static_cast<int>(side);
  o.report_path = report;
  o.command_line = JoinCommandLine(argc, argv);
  o.progress = !quiet;
  o.first_file_number = first_file_number;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::string usage;
  auto options = ParseImportFlags(argc, argv, &files, &usage);
  if (!usage.empty()) {
    std::fprintf(stdout, "%s\n%s", kUsage, usage.c_str());
    return 0;
  }
  if (!options.ok()) {
    std::fprintf(stderr, "cosmoflow-import: %s\n", options.status().message().c_str());
    return 2;
  }
  ImportStats stats;
  if (Status s = ImportMlperf(files, *options, &stats); !s.ok()) {
    std::fprintf(stderr, "cosmoflow-import: %s\n", s.message().c_str());
    return 1;
  }
  std::fprintf(stderr,
               "cosmoflow-import: %lld records from %lld files into %zu shards in %.2f s "
               "(%.1f MB/s compressed input, %.1f MB/s uncompressed); %lld corrupt records "
               "skipped\n",
               static_cast<long long>(stats.records), static_cast<long long>(stats.files),
               stats.shards.size(), stats.seconds, stats.compressed_bytes / 1e6 / stats.seconds,
               stats.uncompressed_bytes / 1e6 / stats.seconds,
               static_cast<long long>(stats.skipped_records));
  for (const auto& shard : stats.shards) std::printf("%s\n", shard.c_str());
  return stats.skipped_records > 0 ? 3 : 0;
}
