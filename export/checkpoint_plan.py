"""Reads a CosmoFlow checkpoint (docs/formats.md, format versions 1 and 2) and resolves its model
spec into a layer plan: every layer with its input and output shape, paddings and tensor names,
and, for a model with an uncertainty head, the head and its calibration factors.

This is the one place where cosmoflow-export restates the engine's semantics (core/nn/spec.cc,
core/nn/layer_table.cc, core/nn/checkpoint.cc); the PyTorch and ONNX writers only read the plan.
Floats of the spec are rounded to float32, as the engine parses them.
"""

import json
import os

import numpy as np

FORMAT_NAME = "cosmoflow-checkpoint"
FORMAT_VERSIONS = (1, 2, 3, 4)
TRANSFORMS = ("none", "log1p", "divide_by_mean", "overdensity")
SPEC_KEYS = {"name", "input_channels", "input_side", "input_transform", "outputs", "layers", "uncertainty"}
HEADS = ("none", "gaussian", "gaussian_full")


def head_width(head, p):
    """spec.h's HeadWidth: the last dense layer's units for P outputs."""
    return {"none": p, "gaussian": 2 * p, "gaussian_full": 2 * p + p * (p - 1) // 2}[head]
# Fields each layer type may carry (as ModelSpec::ToJson writes them) and their defaults.
LAYER_FIELDS = {
    "conv3d": {"filters": None, "kernel": None, "stride": 1, "padding": "valid"},
    "avg_pool": {"size": None},
    "max_pool": {"size": None},
    "leaky_relu": {"alpha": None},
    "dropout": {"rate": None},
    "flatten": {},
    "dense": {"units": None},
    "scaled_tanh": {"scale": None},
    "batch_norm": {"momentum": 0.1, "epsilon": 1e-5},
}
# Tensor-name prefixes (layer_table.cc's name_prefix), counted per type over the network.
NAME_PREFIX = {"conv3d": "conv", "dense": "dense", "batch_norm": "bn"}


class ExportError(Exception):
    """Bad input: the message says what and where (the CLI prints it as one line)."""


def f32(value):
    return float(np.float32(value))


def _crc32c_function():
    try:
        import crcmod.predefined
    except ImportError as e:
        raise ExportError("python3-crcmod is needed to verify checkpoint checksums (apt-get install "
                          "python3-crcmod)") from e
    return crcmod.predefined.mkPredefinedCrcFun("crc-32c")


def _attr(root, name, path):
    if name not in root.attrs:
        raise ExportError(f"{path}: checkpoint has no attribute '{name}'")
    value = root.attrs[name]
    return value.decode() if isinstance(value, bytes) else value


def _read_tensors(root, group, path):
    if group not in root:
        raise ExportError(f"{path}: missing group /{group}")
    g = root[group]
    order = g.attrs.get("order")
    if order is None or order.__class__.__name__ == "Empty":  # no tensors: an empty attribute
        order = []
    tensors = []
    for name in order:
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name not in g:
            raise ExportError(f"{path}: tensor '{name}' listed in /{group} is missing")
        data = np.asarray(g[name][()], dtype="<f4")
        tensors.append((name, data))
    return tensors


def _payload_checksum(spec_json, calibration_json, state, weights, optimizer_state):
    """core/nn/checkpoint.cc's PayloadChecksum: CRC-32C over the same bytes in the same order."""
    crc32c = _crc32c_function()
    parts = [spec_json.encode(), calibration_json.encode(), np.array(state[:4], dtype="<i8").tobytes(),
             state[4].encode()]
    for name, data in weights + optimizer_state:
        shape = data.shape if data.ndim > 0 else (1,)
        parts += [name.encode(), np.array(shape, dtype="<i8").tobytes(), data.tobytes()]
    crc = 0
    for p in parts:
        crc = crc32c(p, crc)  # crcmod continues a CRC from the previous value, as Crc32c does
    return f"{crc:08x}"


def read_checkpoint(path):
    """The verified checkpoint as a dict: spec (parsed JSON), weights {name: float32 array},
    step, epoch, checksum, path. Raises ExportError naming the file and the failed check."""
    import h5py
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ExportError(f"{path}: cannot open as HDF5 ({e})") from e
    try:
        with f:
            return _read_open_checkpoint(f, path)
    except (OSError, KeyError, TypeError, ValueError) as e:  # HDF5 damage below the checksum's reach
        raise ExportError(f"{path}: unreadable checkpoint ({e})") from e


def _read_open_checkpoint(f, path):
    if "format" not in f.attrs or _attr(f, "format", path) != FORMAT_NAME:
        raise ExportError(f"{path}: not a CosmoFlow checkpoint (attribute format='{FORMAT_NAME}' missing)")
    version = int(_attr(f, "format_version", path))
    if version not in FORMAT_VERSIONS:
        raise ExportError(f"{path}: checkpoint format version {version}, this exporter reads versions "
                          f"{', '.join(map(str, FORMAT_VERSIONS))}")
    stored = _attr(f, "checksum", path)
    spec_json = _attr(f, "spec_json", path)
    calibration_json = _attr(f, "calibration_json", path) if "calibration_json" in f.attrs else ""
    state = [int(_attr(f, k, path)) for k in ("step", "epoch", "samples_seen", "rng_seed")]
    state.append(str(_attr(f, "optimizer", path)))
    weights = _read_tensors(f, "weights", path)
    optimizer_state = _read_tensors(f, "optimizer", path)
    actual = _payload_checksum(spec_json, calibration_json, state, weights, optimizer_state)
    if actual != stored:
        raise ExportError(f"{path}: checksum mismatch (stored {stored}, computed {actual}): the checkpoint is corrupt")
    try:
        spec = json.loads(spec_json)
    except ValueError as e:
        raise ExportError(f"{path}: invalid model spec in checkpoint: {e}") from e
    try:
        calibration = json.loads(calibration_json) if calibration_json else None
    except ValueError as e:
        raise ExportError(f"{path}: invalid calibration_json in checkpoint: {e}") from e
    return {"path": path, "spec": spec, "spec_json": spec_json, "weights": dict(weights), "step": state[0],
            "epoch": state[1], "checksum": actual, "calibration": calibration}


def resolve_checkpoint(path, warn):
    """A checkpoint file, or a checkpoint directory's newest valid one (LATEST first, then the
    others newest first, skipping corrupt ones with a warning), as FindLatestCheckpoint does."""
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "ensemble.json")):
        raise ExportError(f"{path}: an ensemble (ensemble.json): export one member's checkpoints "
                          f"({path}/members/m<k>/checkpoints); the exporter writes single networks")
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise ExportError(f"{path}: no such file or directory")
        return read_checkpoint(path)
    names = sorted((n for n in os.listdir(path) if n.startswith("ckpt-") and n.endswith(".h5")), reverse=True)
    latest = os.path.join(path, "LATEST")
    if os.path.exists(latest):
        with open(latest) as fh:
            first = fh.read().strip()
        if first in names:
            names.remove(first)
            names.insert(0, first)
    for name in names:
        try:
            return read_checkpoint(os.path.join(path, name))
        except ExportError as e:
            warn(f"skipping {e}")
    raise ExportError(f"{path}: no valid checkpoint in directory")


def _layer_fields(i, layer):
    if not isinstance(layer, dict) or "type" not in layer:
        raise ExportError(f"model spec: layer {i}: must be an object with a 'type'")
    kind = layer["type"]
    if kind not in LAYER_FIELDS:
        raise ExportError(f"model spec: layer {i}: layer type '{kind}' is not supported by this exporter")
    extra = set(layer) - set(LAYER_FIELDS[kind]) - {"type"}
    if extra:
        raise ExportError(f"model spec: layer {i} ({kind}): field '{sorted(extra)[0]}' is not supported by "
                          "this exporter")
    fields = dict(LAYER_FIELDS[kind])
    fields.update({k: v for k, v in layer.items() if k != "type"})
    missing = [k for k, v in fields.items() if v is None]
    if missing:
        raise ExportError(f"model spec: layer {i} ({kind}): missing field '{missing[0]}'")
    return kind, fields


def conv_geometry(side, kernel, stride, same):
    """spec.cc's ConvGeometryFor: output side and (left, right) padding; SAME as TensorFlow."""
    if same:
        out = (side + stride - 1) // stride
        total = max((out - 1) * stride + kernel - side, 0)
        return out, total // 2, total - total // 2
    return (side - kernel) // stride + 1, 0, 0


def _plan_layer(kind, fields, shape, names):
    """One plan entry and the output shape; shape is (channels, side, flat)."""
    channels, side, flat = shape
    entry = {"type": kind}
    if kind in NAME_PREFIX:
        prefix = NAME_PREFIX[kind]
        entry["name"] = f"{prefix}{names.get(prefix, 0)}"
        names[prefix] = names.get(prefix, 0) + 1
    if kind == "conv3d":
        out, left, right = conv_geometry(side, fields["kernel"], fields["stride"], fields["padding"] == "same")
        entry.update(in_channels=channels, filters=fields["filters"], kernel=fields["kernel"],
                     stride=fields["stride"], pad_left=left, pad_right=right)
        return entry, (fields["filters"], out, False)
    if kind in ("avg_pool", "max_pool"):
        entry["size"] = fields["size"]
        return entry, (channels, side // fields["size"], False)
    if kind == "flatten":
        return entry, (channels * side ** 3, 1, True)
    if kind == "dense":
        entry.update(in_features=channels, units=fields["units"])
        return entry, (fields["units"], 1, True)
    if kind == "batch_norm":
        entry.update(channels=channels, spatial=not flat, epsilon=f32(fields["epsilon"]),
                     momentum=f32(fields["momentum"]))
    elif kind == "leaky_relu":
        entry["alpha"] = f32(fields["alpha"])
    elif kind == "dropout":
        entry["rate"] = f32(fields["rate"])
    elif kind == "scaled_tanh":
        entry["scale"] = f32(fields["scale"])
    return entry, shape


def _check_spec_top(spec):
    if not isinstance(spec, dict):
        raise ExportError("model spec: top level must be a JSON object")
    extra = set(spec) - SPEC_KEYS
    if extra:
        raise ExportError(f"model spec: field '{sorted(extra)[0]}' is not supported by this exporter")
    for key in ("input_channels", "input_side", "outputs", "layers"):
        if key not in spec:
            raise ExportError(f"model spec: missing field '{key}'")
    transform = spec.get("input_transform", "log1p")
    if transform not in TRANSFORMS:
        raise ExportError(f"model spec: unknown input_transform '{transform}'")
    if spec.get("uncertainty", "none") not in HEADS:
        raise ExportError(f"model spec: unknown uncertainty '{spec['uncertainty']}'")


def _per_output(calibration, key, outputs, check, what):
    """The calibration's object `key` as a list in output order, each value passing `check`
    (named `what` in the error), validated as core/nn/uncertainty.cc's CalibrationFromJson does."""
    values = calibration.get(key) if isinstance(calibration, dict) else None
    if not isinstance(values, dict):
        raise ExportError(f"calibration: missing object '{key}'")
    names = [o["name"] for o in outputs]
    extra = set(values) - set(names)
    if extra:
        raise ExportError(f"calibration: {key}.{sorted(extra)[0]} is not an output of the spec")
    out = []
    for name in names:
        v = values.get(name)
        if not isinstance(v, (int, float)) or not np.isfinite(v) or not check(v):
            raise ExportError(f"calibration: {key}.{name} = {v} is not {what}")
        out.append(float(v))
    return out


def _calibration(calibration, outputs):
    """(sigma_scale, sigma_exponent, sigma_reference) per output: factors of 1 without a
    calibration, exponent and reference None for a plain-factor one (sigma -> s r (sigma/r)^b)."""
    if calibration is None:
        return [1.0] * len(outputs), None, None
    scale = _per_output(calibration, "sigma_scale", outputs, lambda v: v > 0, "positive and finite")
    if "sigma_exponent" not in calibration and "sigma_reference" not in calibration:
        return scale, None, None
    exponent = _per_output(calibration, "sigma_exponent", outputs, lambda v: 0 <= v <= 4, "in [0, 4]")
    reference = _per_output(calibration, "sigma_reference", outputs, lambda v: v > 0, "positive and finite")
    return scale, exponent, reference


EDGE_LIMIT, EDGE_REACH = 2.0, 3.0  # core/nn/uncertainty.h's kEdgeLimit, kEdgeReach


def _edge(calibration, outputs):
    """(sigma_edge, edge_centre, edge_half) per output, the last two the prior's centre and half-width
    in normalised label units; all None without an edge term."""
    if calibration is None or "sigma_edge" not in calibration:
        return None, None, None
    edge = _per_output(calibration, "sigma_edge", outputs, lambda v: abs(v) <= EDGE_LIMIT, f"within +-{EDGE_LIMIT:g}")
    prior = calibration.get("prior")
    if not isinstance(prior, dict) or any(not isinstance(prior.get(o["name"]), list) or len(prior[o["name"]]) != 2
                                          for o in outputs):
        raise ExportError("calibration: sigma_edge needs a prior range [low, high] for every output")
    lows = [(prior[o["name"]][0] - o["offset"]) / o["scale"] for o in outputs]
    highs = [(prior[o["name"]][1] - o["offset"]) / o["scale"] for o in outputs]
    return edge, [0.5 * (a + b) for a, b in zip(lows, highs)], [0.5 * abs(b - a) for a, b in zip(lows, highs)]


def plan_model(spec, calibration=None):
    """The spec resolved for the writers: {name, input_channels, input_side, input_transform,
    outputs: [{name, unit, offset, scale}], uncertainty, sigma_scale, sigma_exponent,
    sigma_reference, sigma_edge, edge_centre, edge_half, edge_reach, layers: [plan entries]}
    (sigma_exponent/reference None unless the calibration has them or an edge term, which sets them
    to 1; sigma_edge/edge_centre/edge_half None without an edge term).
    `calibration` is the checkpoint's parsed calibration_json (None: factors of 1)."""
    _check_spec_top(spec)
    shape = (int(spec["input_channels"]), int(spec["input_side"]), False)
    layers, names = [], {}
    for i, layer in enumerate(spec["layers"]):
        kind, fields = _layer_fields(i, layer)
        entry, shape = _plan_layer(kind, fields, shape, names)
        if shape[1] <= 0:
            raise ExportError(f"model spec: layer {i} ({kind}): output side is zero")
        layers.append(entry)
    outputs = [{"name": o["name"], "unit": o.get("unit", ""), "offset": f32(o.get("offset", 0.0)),
                "scale": f32(o.get("scale", 1.0))} for o in spec["outputs"]]
    head = spec.get("uncertainty", "none")
    width = head_width(head, len(outputs))
    if not shape[2] or shape[0] != width:
        raise ExportError(f"model spec: the network ends in {shape[0]} values, the spec's {len(outputs)} outputs "
                          f"with uncertainty '{head}' need {width}")
    if head == "none" and calibration is not None:
        raise ExportError("calibration: the spec has no uncertainty head to calibrate")
    scale, exponent, reference = _calibration(calibration, outputs)
    edge, centre, half = _edge(calibration, outputs)
    if edge is not None and exponent is None:
        exponent, reference = [1.0] * len(outputs), [1.0] * len(outputs)
    return {"name": spec.get("name", ""), "input_channels": int(spec["input_channels"]),
            "input_side": int(spec["input_side"]), "input_transform": spec.get("input_transform", "log1p"),
            "outputs": outputs, "uncertainty": head, "sigma_scale": scale, "sigma_exponent": exponent,
            "sigma_reference": reference, "sigma_edge": edge, "edge_centre": centre, "edge_half": half,
            "edge_reach": EDGE_REACH,
            "layers": layers}


def expected_tensors(plan):
    """{checkpoint tensor name: shape} that the plan needs, in network order."""
    shapes = {}
    for e in plan["layers"]:
        if e["type"] == "conv3d":
            shapes[e["name"] + ".weights"] = (e["filters"], e["in_channels"]) + (e["kernel"],) * 3
            shapes[e["name"] + ".bias"] = (e["filters"],)
        elif e["type"] == "dense":
            shapes[e["name"] + ".weights"] = (e["units"], e["in_features"])
            shapes[e["name"] + ".bias"] = (e["units"],)
        elif e["type"] == "batch_norm":
            for suffix in ("gamma", "beta", "running_mean", "running_var"):
                shapes[f"{e['name']}.{suffix}"] = (e["channels"],)
    return shapes


def check_weights(plan, weights, path):
    """The checkpoint's weights must be exactly the plan's tensors, with the plan's shapes."""
    want = expected_tensors(plan)
    for name in weights:
        if name not in want:
            raise ExportError(f"{path}: tensor '{name}' is not a parameter of the spec")
    for name, shape in want.items():
        if name not in weights:
            raise ExportError(f"{path}: tensor '{name}' is missing")
        if tuple(weights[name].shape) != shape:
            raise ExportError(f"{path}: tensor '{name}' has shape {list(weights[name].shape)}, the spec needs "
                              f"{list(shape)}")
