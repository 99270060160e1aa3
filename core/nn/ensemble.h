// Deep ensembles on disk: K member checkpoints of one spec, trained with different seeds, listed
// in a manifest that a server loads as one model (their posteriors combined by CombineMixture).
//
// Manifest, format "cosmoflow-ensemble" version 1 (docs/formats.md), normally <run>/ensemble.json:
//   {"format": "cosmoflow-ensemble", "format_version": 1,
//    "members": [{"checkpoint": "members/m0/checkpoints/ckpt-000001920.h5", "checksum":
//    "1a2b3c4d"},
//                ...],
//    "calibration": {"samples": 512, "sigma_scale": {...}, "prior": {...}}}   // optional
// Member paths are relative to the manifest's directory (or absolute); each checksum is the
// member checkpoint's own, so a member replaced after the manifest was written is refused. The
// calibration applies to the mixture (the members' own factors are not used inside an ensemble).
// Version 2: the same with a power calibration (sigma_exponent, sigma_reference), written only
// then, so a version-1 reader refuses it instead of applying its factors alone. Version 3: a
// calibration with an edge term (sigma_edge), which a version-2 reader would ignore.
#pragma once

#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/checkpoint.h"
#include "core/nn/uncertainty.h"

namespace cosmoflow {

inline constexpr char kEnsembleManifestName[] = "ensemble.json";
inline constexpr int kEnsembleFormatVersion = 3;  // the newest this build reads

struct EnsembleMember {
  std::string checkpoint;  // as written in the manifest
  std::string checksum;    // the member checkpoint's checksum, 8 hex digits
};

struct EnsembleManifest {
  std::vector<EnsembleMember> members;
  std::string calibration_json;  // "" = none; parsed against the members' spec on load
};

// Format, version, at least one member, every member with a checkpoint and a checksum.
StatusOr<EnsembleManifest> ReadEnsembleManifest(const std::string& path);
// Atomic: written to <path>.tmp.<pid>, fsync'ed and renamed into place.
Status WriteEnsembleManifest(const std::string& path, const EnsembleManifest& manifest);
// The manifest `path` stands for: `path` itself if it is a file ending in ".json", or
// <path>/ensemble.json if `path` is a directory holding one; "" otherwise (a checkpoint).
std::string FindEnsembleManifest(const std::string& path);

struct LoadedEnsemble {
  std::vector<Checkpoint> members;  // verified, same spec and label normalisation
  std::vector<std::string> paths;   // resolved member checkpoint files
  Calibration calibration;          // the manifest's (may be empty)
  std::string checksum;             // CRC-32C over the member checksums and the calibration
};

// Reads the manifest and every member checkpoint (each verified as ReadCheckpoint does), then
// checks each member against the manifest's checksum and member 0's spec and label normalisation,
// and the calibration against the spec. Errors name the manifest and the member:
// "ensemble.json: member 2 (members/m2/checkpoints/ckpt-000000100.h5): ...".
StatusOr<LoadedEnsemble> LoadEnsemble(const std::string& manifest_path);

}  // namespace cosmoflow
