"""cosmoflow-export: a CosmoFlow checkpoint as a PyTorch module + state dict, and as ONNX.

    cosmoflow-export --checkpoint runs/ckpts --out exported [--name model] [--format all|torch|onnx]

writes OUT/NAME.py (the module, built from the checkpoint's spec), OUT/NAME.pt (its state dict)
and OUT/NAME.onnx (opset 17, dynamic batch, input transform and label de-normalisation inside the
graph, checked by onnx.checker). Every file is written to a temporary name and renamed into place
after all of them were written, so OUT never holds a half-written export. Errors: one line on
stderr, exit 1 (2 for bad flags). docs/serving.md describes the outputs.

Written in Python because both targets are Python libraries (torch.save for the state dict,
onnx.helper and onnx.checker for the graph); the checkpoint is read with h5py and verified with
the same CRC-32C checksum as core/nn/checkpoint.cc.
"""

import argparse
import importlib.machinery
import importlib.util
import json
import os
import sys

import checkpoint_plan
from checkpoint_plan import ExportError

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "torch_model_template.py")
PROG = "cosmoflow-export"


def _warn(message):
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def module_source(ckpt, plan):
    """The template with SPEC_JSON, PLAN and CHECKPOINT filled in."""
    values = {
        "SPEC_JSON": repr(ckpt["spec_json"]),
        "PLAN": "json.loads(" + repr(json.dumps(plan)) + ")",
        "CHECKPOINT": repr({"path": os.path.abspath(ckpt["path"]), "step": ckpt["step"],
                            "checksum": ckpt["checksum"]}),
    }
    lines = []
    with open(TEMPLATE) as fh:
        for line in fh:
            key = line.split(" = ", 1)[0]
            if key in values and "# cosmoflow-export:" in line:
                line = f"{key} = {values.pop(key)}\n"
            lines.append(line)
    assert not values, f"template lacks {sorted(values)}"
    return "".join(lines)


def _import_module(path):
    # An explicit loader: the temporary file name does not end in .py.
    loader = importlib.machinery.SourceFileLoader("cosmoflow_exported_model", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_torch(ckpt, plan, py_tmp, pt_tmp):
    """The module source and its state dict; the state dict is loaded back strictly into the
    written module before the export counts as done."""
    try:
        import torch
    except ImportError as e:
        raise ExportError("the PyTorch export needs python3-torch (or use --format onnx)") from e
    with open(py_tmp, "w") as fh:
        fh.write(module_source(ckpt, plan))
    module = _import_module(py_tmp)
    model = module.CosmoFlowModel()
    state = model.state_dict()
    renames = {"weight": ("weights", "gamma"), "bias": ("bias", "beta"), "running_mean": ("running_mean",),
               "running_var": ("running_var",)}
    for key in state:
        layer, suffix = key.rsplit(".", 1)
        if suffix == "num_batches_tracked":
            continue
        source = next(f"{layer}.{s}" for s in renames[suffix] if f"{layer}.{s}" in ckpt["weights"])
        state[key] = torch.from_numpy(ckpt["weights"][source].copy())
    torch.save(state, pt_tmp)
    module.load(pt_tmp)


def write_onnx(ckpt, plan, onnx_tmp):
    try:
        import onnx
        import onnx_writer
    except ImportError as e:
        raise ExportError("the ONNX export needs python3-onnx (or use --format torch)") from e
    info = {"checkpoint": os.path.abspath(ckpt["path"]), "step": str(ckpt["step"]), "checksum": ckpt["checksum"],
            "spec_json": ckpt["spec_json"]}
    model = onnx_writer.build_model(plan, ckpt["weights"], info)
    onnx.save(model, onnx_tmp)


def export(args):
    ckpt = checkpoint_plan.resolve_checkpoint(args.checkpoint, _warn)
    plan = checkpoint_plan.plan_model(ckpt["spec"], ckpt["calibration"])
    checkpoint_plan.check_weights(plan, ckpt["weights"], ckpt["path"])
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise ExportError(f"{args.out}: cannot create output directory ({e.strerror})") from e
    final = {ext: os.path.join(args.out, args.name + ext) for ext in (".py", ".pt", ".onnx")}
    wanted = {"all": (".py", ".pt", ".onnx"), "torch": (".py", ".pt"), "onnx": (".onnx",)}[args.format]
    tmp = {ext: f"{final[ext]}.tmp.{os.getpid()}" for ext in wanted}
    try:
        if ".py" in tmp:
            write_torch(ckpt, plan, tmp[".py"], tmp[".pt"])
        if ".onnx" in tmp:
            write_onnx(ckpt, plan, tmp[".onnx"])
        for ext in wanted:
            os.replace(tmp[ext], final[ext])
    except OSError as e:
        raise ExportError(f"{args.out}: cannot write the export ({e})") from e
    finally:
        for path in tmp.values():
            if os.path.exists(path):
                os.remove(path)
    return ckpt, [final[ext] for ext in wanted]


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line on stderr and exit 2, like the project's other programs (argparse adds the usage)."""
        print(f"{PROG}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    parser = _Parser(prog=PROG, description="Export a CosmoFlow checkpoint to PyTorch and ONNX.")
    parser.add_argument("--checkpoint", required=True, help="checkpoint file, or directory (its newest valid one)")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--name", default="model", help="file stem: NAME.py, NAME.pt, NAME.onnx (default: model)")
    parser.add_argument("--format", choices=("all", "torch", "onnx"), default="all")
    args = parser.parse_args(argv)
    if not args.name or "/" in args.name or not args.name.replace("_", "a").isalnum():
        parser.error(f"--name must be a Python identifier-like stem (letters, digits, _), got '{args.name}'")
    try:
        ckpt, written = export(args)
    except ExportError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(f"{PROG}: {ckpt['path']} (step {ckpt['step']}, checksum {ckpt['checksum']}) -> {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
