"""Adds a top-level field to a checkpoint's spec_json and rewrites its checksum, so that the
checkpoint stays valid but carries a spec the exporter does not know (export_test.cc).
    add_spec_field.py EXPORT_DIR CHECKPOINT FIELD JSON_VALUE"""
import json
import sys

import h5py

sys.path.insert(0, sys.argv[1])
import checkpoint_plan  # noqa: E402

path, field, value = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
with h5py.File(path, "r+") as f:
    spec = json.loads(f.attrs["spec_json"])
    spec[field] = value
    text = json.dumps(spec)
    state = [int(f.attrs[k]) for k in ("step", "epoch", "samples_seen", "rng_seed")] + [str(f.attrs["optimizer"])]
    weights = checkpoint_plan._read_tensors(f, "weights", path)
    optimizer = checkpoint_plan._read_tensors(f, "optimizer", path)
    f.attrs["spec_json"] = text
    calibration = f.attrs.get("calibration_json", b"")
    calibration = calibration.decode() if isinstance(calibration, bytes) else str(calibration)
    f.attrs["checksum"] = checkpoint_plan._payload_checksum(text, calibration, state, weights, optimizer)
