"""Reads a run directory's TensorBoard event files with a reader independent of the trainer's
writer, and checks them against train_log.csv (tests/trainer/tensorboard_test.sh).

    tensorboard_check.py RUN_DIR [--expect-files N] [--corrupt-copy]

The reader: TFRecord framing with both masked CRC-32C checked (a pure-Python CRC, not
core/base's), Event/Summary parsed by python3-protobuf from the public event.proto/summary.proto
(the subset copies in tfevents_proto/, compiled here with grpc_tools' protoc). Checks: every
file starts with file_version "brain.Event:2"; every CSV row (last per (kind, step), as the CSV's
readers do) has an event at its step with the same scalars, equal to float32 rounding and the CSV's
6 significant digits. --corrupt-copy also flips one byte of a copy and requires the reader to
refuse it. Prints one line and exits 1 on the first failure.
"""

import csv
import glob
import importlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "tfevents_proto")


def crc32c(data):
    table = crc32c.table
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    crc32c.table.append(_c)


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def compile_protos(out_dir):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}",
                    "tensorflow/core/framework/summary.proto", "tensorflow/core/util/event.proto"], check=True)
    sys.path.insert(0, out_dir)
    return importlib.import_module("tensorflow.core.util.event_pb2")


def read_records(path):
    with open(path, "rb") as f:
        data = f.read()
    pos, records = 0, []
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if header_crc != masked(crc32c(header)):
            raise ValueError(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(body) != length or body_crc != masked(crc32c(body)):
            raise ValueError(f"{path}: bad data CRC at byte {pos}")
        records.append(body)
        pos += 16 + length
    return records


def read_events(path, event_pb2):
    events = []
    for body in read_records(path):
        e = event_pb2.Event()
        e.ParseFromString(body)
        events.append(e)
    if not events or events[0].file_version != "brain.Event:2":
        raise ValueError(f"{path}: the first event is not file_version brain.Event:2")
    return events


def csv_expectations(run_dir):
    """{(kind, step): {tag: value}} from the last row per (kind, step)."""
    rows = {}
    with open(os.path.join(run_dir, "train_log.csv")) as f:
        for r in csv.DictReader(f):
            rows[(r["kind"], int(r["step"]))] = r
    expected = {}
    for (kind, step), r in rows.items():
        cols = ["loss", "lr", "samples_per_s", "data_wait_frac", "comm_frac"] if kind == "train" else \
            ["loss", "mae"] + [c for c in r if c.startswith("rel_err_")]
        tags = {"lr": "learning_rate"}
        expected[(kind, step)] = {f"{kind}/{tags.get(c, c)}": float(r[c]) for c in cols}
    return expected


def check(run_dir, event_pb2, expect_files):
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if expect_files is not None and len(files) != expect_files:
        raise ValueError(f"{run_dir}: {len(files)} events files, expected {expect_files}")
    seen = {}
    for path in files:
        for e in read_events(path, event_pb2)[1:]:
            values = {v.tag: v.simple_value for v in e.summary.value}
            kind = next(iter(values)).split("/")[0]
            seen[(kind, e.step)] = values
    expected = csv_expectations(run_dir)
    for key, want in expected.items():
        got = seen.get(key)
        if got is None:
            raise ValueError(f"no event for the {key[0]} row at step {key[1]}")
        if set(got) != set(want):
            raise ValueError(f"step {key[1]}: tags {sorted(got)}, expected {sorted(want)}")
        for tag, value in want.items():
            if abs(got[tag] - value) > 1e-5 * abs(value) + 1e-30:
                raise ValueError(f"step {key[1]} {tag}: event {got[tag]!r}, train_log.csv {value!r}")
    if set(seen) != set(expected):
        raise ValueError(f"events at {sorted(set(seen) - set(expected))} have no train_log.csv row")
    kinds = sorted({k for k, _ in expected})
    return f"{len(files)} events file(s), {len(expected)} rows ({', '.join(kinds)}) match train_log.csv"


def check_corrupt_copy(run_dir, event_pb2):
    path = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))[0]
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, os.path.basename(path))
        shutil.copy(path, bad)
        with open(bad, "r+b") as f:
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0x01
            f.seek(0)
            f.write(data)
        try:
            read_events(bad, event_pb2)
        except ValueError:
            return
    raise ValueError("a flipped byte went unnoticed by the CRC checks")


def main(argv):
    run_dir = argv[1]
    expect_files = int(argv[argv.index("--expect-files") + 1]) if "--expect-files" in argv else None
    with tempfile.TemporaryDirectory() as out:
        event_pb2 = compile_protos(out)
        try:
            message = check(run_dir, event_pb2, expect_files)
            if "--corrupt-copy" in argv:
                check_corrupt_copy(run_dir, event_pb2)
        except (ValueError, OSError, KeyError) as e:
            print(f"tensorboard_check: FAIL: {e}")
            return 1
    print(f"tensorboard_check: ok: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
