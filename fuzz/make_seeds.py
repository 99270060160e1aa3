#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into OUT/<target>/ (docs/fuzzing.md):

  fuzz_validate    PredictRequests of the project's own client (cosmoflow_client.cube_message)
  fuzz_tfrecord    TFRecord files built like the MLPerf ones (features 'x' and 'y'), side 4; with
                   --real DIR also the start of each real (gzip) file decompressed and a side-4
                   example made from its first record's labels and voxels
  fuzz_npy         .npy files as numpy writes them (int16/float32, 3-D and 4-D, format 1.0 and 2.0)
  fuzz_spec        the spec files in tools/specs/
  fuzz_flags       command lines, NUL-separated
  fuzz_checkpoint  a few byte strings (its input chooses mutations of a valid checkpoint)
  fuzz_dataset     byte strings that make valid shards (fuzz/dataset_fuzz.cc reads its input as
                   the choices of the shard it writes), and a few that do not

    make_seeds.py OUT [--real ../shared/data/mlperf-cosmoflow]
"""
import argparse
import glob
import gzip
import io
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):  # length-delimited
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(x_bytes, labels):
    """A tf.train.Example with bytes feature 'x' and float feature 'y' (packed)."""
    x = _field(1, _field(1, x_bytes))                          # Feature.bytes_list.value
    y = _field(2, _field(1, struct.pack("<%df" % len(labels), *labels)))  # Feature.float_list.value
    features = _field(1, _field(1, b"x") + _field(2, x)) + _field(1, _field(1, b"y") + _field(2, y))
    return _field(1, features)


def frame(record):
    import crcmod.predefined
    crc = crcmod.predefined.mkPredefinedCrcFun("crc-32c")

    def masked(data):
        c = crc(data)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked(length)) + record + struct.pack("<I", masked(record))


def write(out, target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)


def tfrecord_seeds(out, real_dir):
    rng = np.random.default_rng(1)
    cube = rng.poisson(2.0, size=(4, 4, 4, 4)).astype("<i2").tobytes()
    ex = example(cube, [0.1, -0.2, 0.3, 0.05])
    write(out, "fuzz_tfrecord", "one.tfrecord", frame(ex))
    write(out, "fuzz_tfrecord", "two.tfrecord", frame(ex) + frame(example(cube[:8], [1.0])))
    write(out, "fuzz_tfrecord", "example.pb", ex)
    for path in sorted(glob.glob(os.path.join(real_dir, "*.tfrecord"))) if real_dir else []:
        with gzip.open(path, "rb") as f:
            head = f.read(1 << 20)
        name = os.path.basename(path)
        write(out, "fuzz_tfrecord", name + ".head", head[:4096])
        length = struct.unpack("<Q", head[:8])[0]
        record = head[12:12 + length] if length + 16 <= len(head) else b""
        # Feature 'y' (4 packed floats) is the record's last map entry: its values end the record.
        labels = list(struct.unpack("<4f", record[-16:])) if len(record) >= 16 else [0.0] * 4
        voxels = np.frombuffer(head[64:64 + 512], dtype="<i2")
        write(out, "fuzz_tfrecord", name + ".side4", frame(example(voxels.tobytes(), labels)))


def npy_seeds(out):
    rng = np.random.default_rng(2)
    arrays = {"d3_i2": rng.poisson(2.0, (4, 4, 4)).astype(np.int16),
              "c2_f4": rng.random((2, 4, 4, 4), dtype=np.float32),
              "last_f4": rng.random((4, 4, 4, 3), dtype=np.float32)}
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, a)
        write(out, "fuzz_npy", name + ".npy", buf.getvalue())
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arrays["d3_i2"], version=(2, 0))
    write(out, "fuzz_npy", "v2.npy", buf.getvalue())


def validate_seeds(out):
    sys.path.insert(0, os.path.join(SOURCE, "client", "python"))
    from cosmoflow_client import cube_message, pb
    rng = np.random.default_rng(3)
    cubes = {"c1_i2": rng.poisson(2.0, (1, 8, 8, 8)).astype(np.int16),
             "c2_f4": rng.random((2, 4, 4, 4), dtype=np.float32)}
    for name, c in cubes.items():
        write(out, "fuzz_validate", name, pb.PredictRequest(cube=cube_message(c), request_id="r").SerializeToString())
    last = cube_message(np.moveaxis(cubes["c2_f4"], 0, -1).copy(), layout="channel_last")
    write(out, "fuzz_validate", "last", pb.PredictRequest(cube=last).SerializeToString())


def dataset_seeds(out):
    """Inputs in the order dataset_fuzz.cc consumes them: valid shards of N cubes, one channel
    per redshift, side S, three float32 parameters; then two byte strings that are not."""
    def double(v):  # Input::Double: two big-endian 32-bit halves of the IEEE bits
        return struct.pack(">d", v)

    def shard(n, channels, side, samples):
        b = bytes([1, 1, 1, 1, 1, 1, 1, 1, 1, channels]) + b"".join(double(z) for z in (0.0, 0.5, 1.5, 3.0)[:channels])
        b += bytes([1]) + double(8.0) + bytes([1, 5]) + b"synth"
        b += bytes([1, 1]) if samples else bytes([0])  # sample_fields: box_size_mpc_h, group
        b += bytes([1, 5, n, channels, side, side, side, 0, 1]) + bytes(range(256))[: n * channels * side ** 3 * 2]
        b += bytes([1, 2, n, 3, 1, 0]) + struct.pack("<3f", 0.3, 0.8, 0.96) * n
        b += bytes([0])  # no params_unit
        if samples:
            b += bytes([1]) + bytes([1, 1, n, 4, 0]) + double(8.0) * n + bytes([1, 1, n, 4, 0]) + bytes(8 * n)
        else:
            b += bytes([0])
        return b

    for i, seed in enumerate([shard(2, 1, 2, False), shard(1, 4, 2, False), shard(3, 2, 2, True),
                              b"\x00" * 16, bytes(range(200))]):
        write(out, "fuzz_dataset", f"shard{i}", seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--real", default=None, help="directory of real MLPerf .tfrecord files (optional)")
    args = ap.parse_args()
    tfrecord_seeds(args.out, args.real if args.real and os.path.isdir(args.real) else None)
    npy_seeds(args.out)
    validate_seeds(args.out)
    for path in glob.glob(os.path.join(SOURCE, "tools", "specs", "*.json")):
        with open(path, "rb") as f:
            write(args.out, "fuzz_spec", os.path.basename(path), f.read())
    for i, argv in enumerate([["--out", "x", "--samples=3", "pos"], ["--lr", "1e-3", "--verbose=false"],
                              ["--spec", "sc18", "--batch", "4", "--help"], ["--samples", "-5", "--", "--lr"]]):
        write(args.out, "fuzz_flags", f"argv{i}", b"\0".join(a.encode() for a in argv))
    for i, seed in enumerate([b"", b"\x01\x02\x03\x04" * 8, bytes(range(64))]):
        write(args.out, "fuzz_checkpoint", f"ops{i}", seed)
    dataset_seeds(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
