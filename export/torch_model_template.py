"""A CosmoFlow model as a PyTorch module, written by cosmoflow-export (docs/serving.md).

Needs only torch (Debian: python3-torch) and numpy. The architecture is built from PLAN, the
checkpoint's model spec resolved by the exporter (shapes, TensorFlow-style SAME paddings with the
odd voxel on the right, tensor names); the weights are the state dict next to this file.

    import torch, model                      # this file, saved as model.py
    net = model.load("model.pt")             # eval mode: dropout off, batch norm on running statistics
    params = net(counts)                     # counts: float32 [N, C, D, H, W] particle counts
                                             # -> [N, P] physical values, in the order of OUTPUTS

forward() applies the spec's input transform and the label de-normalisation (offset + scale * n),
as cosmoflow-server does; forward_normalised() takes an already transformed input and returns the
normalised outputs. State-dict keys are the checkpoint's tensor names with PyTorch's suffixes:
convN.weight/bias, denseN.weight/bias, bnN.weight (gamma)/bias (beta)/running_mean/running_var.

Run as a script, it predicts .npy cubes ((D,H,W) or (C,D,H,W), int16 or float32) and prints JSON:
    python3 model.py cube0.npy cube1.npy       # weights: model.pt beside it, or --weights FILE
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from torch import nn

SPEC_JSON = None  # cosmoflow-export: the checkpoint's spec_json
PLAN = None  # cosmoflow-export: the resolved layer plan
CHECKPOINT = None  # cosmoflow-export: where the weights came from (path, step, checksum)

OUTPUTS = [o["name"] for o in PLAN["outputs"]] if PLAN else []


class ScaledTanh(nn.Module):
    """y = scale * tanh(x): the spec's scaled_tanh layer."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return self.scale * torch.tanh(x)


def input_transform(counts, transform):
    """The spec's input transform on float32 counts [N, C, D, H, W], as core/nn/spec.cc computes it:
    the channel mean in double, its reciprocal rounded to float32, an empty channel kept at 0 (or -1)."""
    if transform == "none":
        return counts
    if transform == "log1p":
        return torch.log1p(counts)
    mean = counts.double().mean(dim=(2, 3, 4), keepdim=True)
    inv = torch.where(mean > 0, 1.0 / mean, torch.zeros_like(mean)).float()
    shift = 1.0 if transform == "overdensity" else 0.0
    return counts * inv - shift


def _make_layer(e, counters):
    """(name, module) pairs for one plan entry; a SAME conv with uneven padding gets a pad layer."""
    kind = e["type"]
    if kind == "conv3d":
        pads = []
        left, right = e["pad_left"], e["pad_right"]
        if left != right:
            pads = [(e["name"] + "_pad", nn.ConstantPad3d((left, right) * 3, 0.0))]
            left = 0
        conv = nn.Conv3d(e["in_channels"], e["filters"], e["kernel"], stride=e["stride"], padding=left)
        return pads + [(e["name"], conv)]
    if kind == "dense":
        return [(e["name"], nn.Linear(e["in_features"], e["units"]))]
    if kind == "batch_norm":
        norm = nn.BatchNorm3d if e["spatial"] else nn.BatchNorm1d
        return [(e["name"], norm(e["channels"], eps=e["epsilon"], momentum=e["momentum"]))]
    modules = {
        "avg_pool": lambda: nn.AvgPool3d(e["size"], stride=e["size"]),
        "max_pool": lambda: nn.MaxPool3d(e["size"], stride=e["size"]),
        "leaky_relu": lambda: nn.LeakyReLU(e["alpha"]),
        "dropout": lambda: nn.Dropout(e["rate"]),
        "flatten": lambda: nn.Flatten(1),
        "scaled_tanh": lambda: ScaledTanh(e["scale"]),
    }
    index = counters.get(kind, 0)
    counters[kind] = index + 1
    return [(f"{kind}{index}", modules[kind]())]


class CosmoFlowModel(nn.Module):
    def __init__(self, plan=None):
        super().__init__()
        self.plan = plan or PLAN
        self.layer_names = []
        counters = {}
        for e in self.plan["layers"]:
            for name, module in _make_layer(e, counters):
                self.add_module(name, module)
                self.layer_names.append(name)
        outs = self.plan["outputs"]
        self.register_buffer("offset", torch.tensor([o["offset"] for o in outs], dtype=torch.float32), False)
        self.register_buffer("scale", torch.tensor([o["scale"] for o in outs], dtype=torch.float32), False)

    def forward_normalised(self, x):
        for name in self.layer_names:
            x = getattr(self, name)(x)
        return x

    def forward(self, counts):
        x = input_transform(counts.float(), self.plan["input_transform"])
        return self.offset + self.scale * self.forward_normalised(x)


def load(weights_path, plan=None):
    """The model with the state dict at weights_path (strict: every key present, none extra), in eval mode."""
    model = CosmoFlowModel(plan)
    state = torch.load(weights_path, map_location="cpu")
    model.load_state_dict(state, strict=True)
    return model.eval()


def _read_cube(path, plan):
    cube = np.load(path)
    if cube.dtype not in (np.int16, np.float32):
        raise ValueError(f"{path}: dtype {cube.dtype}, expected int16 or float32")
    if cube.ndim == 3:
        cube = cube[np.newaxis]
    want = (plan["input_channels"],) + (plan["input_side"],) * 3
    if cube.shape != want:
        raise ValueError(f"{path}: shape {list(cube.shape)}, the model takes {list(want)} (channel-first)")
    return torch.from_numpy(cube.astype(np.float32))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Predict .npy cubes with this exported CosmoFlow model.")
    # The exporter writes NAME.py and NAME.pt side by side.
    parser.add_argument("--weights", default=os.path.splitext(os.path.abspath(__file__))[0] + ".pt")
    parser.add_argument("cubes", nargs="+")
    args = parser.parse_args(argv)
    try:
        model = load(args.weights)
        batch = torch.stack([_read_cube(p, model.plan) for p in args.cubes])
    except (OSError, ValueError, RuntimeError) as e:
        print(f"{os.path.basename(__file__)}: error: {e}", file=sys.stderr)
        return 1
    with torch.no_grad():
        values = model(batch).numpy()
    rows = [{"cube": p, "parameters": dict(zip(OUTPUTS, map(float, v)))} for p, v in zip(args.cubes, values)]
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
