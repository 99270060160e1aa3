// Cutting universes into sub-cubes: each (C, n, n, n) cube of a dataset becomes (n/s)^3 cubes of
// (C, s, s, s) with every channel, so that a network trains on s^3 sub-cubes at the parent's
// voxel size and its predictions can be averaged per universe (tools/average_subcubes.py).
// With bin b > 1 each parent is first coarsened: every b^3 block of voxels becomes one voxel
// holding their sum (particle counts stay counts, mass is conserved), so a (C, n, n, n) parent at
// voxel size v becomes (C, n/b, n/b, n/b) at b v before it is cut; sub-cubes then see s b voxels
// of the parent (e.g. 32^3 sub-cubes of 2 Mpc/h voxels from 1 Mpc/h universes, as in Pan et al.).
//
// Sub-cube q = (i m + j) m + k (m = n/(b s)) of a parent holds the coarsened parent's voxels
// [i s, (i+1) s) x [j s, (j+1) s) x [k s, (k+1) s) (depth, height, width). Each sub-cube keeps its
// parent's labels (and unit labels) and records, in /sample/<name> (core/io/dataset.h):
//   group          the parent's index in the input dataset, plus group_offset,
//   subcube        q,
//   box_size_mpc_h its side in Mpc/h: the parent's own (from its /sample/box_size_mpc_h, else the
//                  shard's box_size_mpc_h attribute) times b s/n.
// The attribute box_size_mpc_h of the output is the input's nominal value times b s/n.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/io/cube.h"

namespace cosmoflow {
namespace synth {

struct SubcubeOptions {
  std::string in;   // a shard or a directory of shards
  std::string out;  // a directory (shards <prefix>-<first parent, 8 digits>.h5) or FILE.h5
  std::string prefix = "subcubes";
  int side = 32;               // sub-cube side s; must divide the coarsened side n/b
  int bin = 1;                 // b: voxels summed in b^3 blocks first; must divide n
  int parents_per_shard = 16;  // 16 x 64 sub-cubes of 4 x 32^3 int16: 256 MiB per shard
  int compression_level = 0;
  int64_t group_offset = 0;  // added to the parent index (disjoint ids across input sets)
  bool progress = true;
  std::string command_line;  // recorded in provenance
};

struct SubcubeStats {
  int64_t parents = 0, subcubes = 0;
  std::vector<std::string> shards;
};

// Writes sub-cube q of `parent` (int16, channel-first) into *dst, shaped (C, side, side, side).
void CutSubcube(const Cube& parent, int side, int q, Cube* dst);

// Writes `parent` coarsened by `bin` into *dst, shaped (C, n/bin, n/bin, n/bin): each voxel the
// sum of a bin^3 block. Refuses (naming the voxel's sum) a block whose sum exceeds int16.
Status BinCube(const Cube& parent, int bin, Cube* dst);

// Cuts every cube of options.in. Errors name the file and the problem (a bin that does not divide
// the parent's side, a side that does not divide the coarsened one, a coarsened count beyond
// int16, unreadable input, unwritable output); no shard is left half-written.
Status CutSubcubes(const SubcubeOptions& options, SubcubeStats* stats);

}  // namespace synth
}  // namespace cosmoflow
