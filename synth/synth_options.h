// Command-line flags of `synth` (synth_main.cc): what to generate and where to write it.
//
//   synth --out DIR|FILE.h5 [--samples N] [--side S] [--redshifts z,...] [--seed N] [...]
// Every problem (unknown flag, bad number, out of range, an invalid universe or parameter range)
// is an InvalidArgument (or the universe's own check) whose message names the flag; synth prints
// it as one line and exits with 2. SynthUsageText() lists every flag.
#pragma once

#include <cstdint>
#include <string>

#include "core/base/status.h"
#include "synth/cosmology.h"
#include "synth/universe.h"

namespace cosmoflow {
namespace synth {

struct SynthOptions {
  std::string out;  // a directory (shards <prefix>-<first index>.h5) or FILE.h5
  std::string prefix = "synth";
  bool single_file = false;  // `out` ends in .h5: one file, samples_per_shard = samples
  int64_t samples = 1;
  int64_t first_index = 0;  // sample i is a pure function of (seed, i)
  int64_t seed = 0;
  int64_t samples_per_shard = 64;
  int compression_level = 0;  // HDF5 gzip 0..9
  int workers = 1;            // cubes generated at once (threads / threads-per-cube)
  bool quiet = false;         // no progress lines
  UniverseOptions universe;   // validated
  ParamRanges ranges;         // validated
  CosmologyParams base;       // omega_b and h; Omega_M, sigma_8, n_s (and h with --h0) are drawn
  std::string preset;         // --preset name ("" without), for the provenance record
  std::string command_line;   // for the provenance record
};

// Parses argv[1..argc). With --help, sets *help and returns (the caller prints SynthUsageText()).
StatusOr<SynthOptions> ParseSynthOptions(int argc, char** argv, bool* help);
std::string SynthUsageText();

}  // namespace synth
}  // namespace cosmoflow
