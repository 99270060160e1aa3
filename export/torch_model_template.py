"""A CosmoFlow model as a PyTorch module, written by cosmoflow-export (docs/serving.md).

Needs only torch (Debian: python3-torch) and numpy. The architecture is built from PLAN, the
checkpoint's model spec resolved by the exporter (shapes, TensorFlow-style SAME paddings with the
odd voxel on the right, tensor names); the weights are the state dict next to this file.

    import torch, model                      # this file, saved as model.py
    net = model.load("model.pt")             # eval mode: dropout off, batch norm on running statistics
    params = net(counts)                     # counts: float32 [N, C, D, H, W] particle counts
                                             # -> [N, P] physical values, in the order of OUTPUTS
    params, cov = net(counts)                # a model with an uncertainty head (UNCERTAINTY != "none"):
                                             # also the calibrated covariance [N, P, P], float64

forward() applies the spec's input transform and the label de-normalisation (offset + scale * n),
as cosmoflow-server does, and for an uncertainty head decodes the Gaussian posterior the head
stands for (core/nn/spec.h), multiplies sigma by the checkpoint's calibration factors and
de-normalises the covariance (cov_ij * scale_i * scale_j), in float64 as the server does;
forward_normalised() takes an already transformed input and returns the raw head outputs. State-dict keys are the checkpoint's tensor names with PyTorch's suffixes:
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
UNCERTAINTY = PLAN["uncertainty"] if PLAN else "none"
LOG_VARIANCE_LIMIT = 40.0  # core/nn/uncertainty.h: log-variances clamped to +-40, log-diagonals to +-20


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


def head_covariance(raw, head, p):
    """The normalised covariance [N, P, P] (float64) that the head outputs raw [N, W] stand for,
    as core/nn/uncertainty.cc's DecodeHead computes it: gaussian a diagonal of exp(log-variance);
    gaussian_full (L L^T)^-1 = M^T M with M = L^-1 by forward substitution."""
    raw = raw.double()
    if head == "gaussian":
        return torch.diag_embed(torch.exp(raw[:, p:2 * p].clamp(-LOG_VARIANCE_LIMIT, LOG_VARIANCE_LIMIT)))
    half = 0.5 * LOG_VARIANCE_LIMIT
    l = {(i, i): torch.exp(raw[:, p + i].clamp(-half, half)) for i in range(p)}
    k = 2 * p
    for i in range(1, p):
        for j in range(i):
            l[i, j] = raw[:, k]
            k += 1
    m = {}
    for j in range(p):
        for i in range(j, p):
            v = torch.ones_like(l[i, i]) if i == j else torch.zeros_like(l[i, i])
            for t in range(j, i):
                v = v - l[i, t] * m[t, j]
            m[i, j] = v / l[i, i]
    rows = [torch.stack([sum(m[t, i] * m[t, j] for t in range(max(i, j), p)) for j in range(p)], dim=1)
            for i in range(p)]
    return torch.stack(rows, dim=1)


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
        # Physical sigma = calibration factor x label scale x normalised sigma; the factor of a power
        # calibration, s (sigma / r)^(b - 1), depends on each sample's sigma (calibrate()).
        scale = torch.tensor([o["scale"] for o in outs], dtype=torch.float64)
        self.register_buffer("cov_factor", torch.outer(scale, scale), False)
        self.register_buffer("sigma_scale", torch.tensor(self.plan["sigma_scale"], dtype=torch.float64), False)
        power = self.plan.get("sigma_exponent") is not None
        self.register_buffer("sigma_exponent", torch.tensor(self.plan["sigma_exponent"] if power else [1.0] * len(outs),
                                                            dtype=torch.float64), False)
        self.register_buffer("sigma_reference", torch.tensor(self.plan["sigma_reference"] if power else [1.0] * len(outs),
                                                             dtype=torch.float64), False)
        edge = self.plan.get("sigma_edge") is not None
        for key, default in (("sigma_edge", 0.0), ("edge_centre", 0.0), ("edge_half", 1.0)):
            self.register_buffer(key, torch.tensor(self.plan[key] if edge else [default] * len(outs),
                                                   dtype=torch.float64), False)

    def calibrate(self, cov, mean):
        """cov_ij * f_i f_j with f_i = s_i (sigma_i / r_i)^(b_i - 1) exp(e_i u_i^2), sigma_i = sqrt(cov_ii)
        and u_i the clamped edge coordinate of the normalised mean_i, as core/nn/uncertainty.cc's
        ApplyCalibration."""
        sigma = torch.sqrt(torch.clamp(torch.diagonal(cov, dim1=1, dim2=2), min=0.0))
        f = self.sigma_scale * torch.where(sigma > 0, (sigma / self.sigma_reference) ** (self.sigma_exponent - 1.0),
                                           torch.ones_like(sigma))
        reach = self.plan.get("edge_reach", 3.0)
        u = torch.clamp((mean.double() - self.edge_centre) / self.edge_half, -reach, reach)
        f = f * torch.exp(self.sigma_edge * u * u)
        return cov * f[:, :, None] * f[:, None, :]

    def forward_normalised(self, x):
        for name in self.layer_names:
            x = getattr(self, name)(x)
        return x

    def forward(self, counts):
        x = input_transform(counts.float(), self.plan["input_transform"])
        raw = self.forward_normalised(x)
        p = len(self.plan["outputs"])
        params = self.offset + self.scale * raw[:, :p]
        if self.plan["uncertainty"] == "none":
            return params
        return params, self.calibrate(head_covariance(raw, self.plan["uncertainty"], p), raw[:, :p]) * self.cov_factor


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
        out = model(batch)
    values, covs = (out[0].numpy(), out[1].numpy()) if UNCERTAINTY != "none" else (out.numpy(), None)
    rows = [{"cube": p, "parameters": dict(zip(OUTPUTS, map(float, v)))} for p, v in zip(args.cubes, values)]
    for row, cov in zip(rows, covs if covs is not None else []):
        row["sigma"] = dict(zip(OUTPUTS, map(float, np.sqrt(np.diag(cov)))))
        row["covariance"] = cov.tolist()
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
