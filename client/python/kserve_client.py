#!/usr/bin/python3
"""Calls cosmoflow-server through the Open Inference Protocol (KServe v2 / Triton gRPC) with
python3-grpcio, sending exactly what Triton's tritonclient.grpc sends: one InferInputTensor with a
datatype string and a shape, its bytes in raw_input_contents, the outputs requested by name, and the
answer read back from raw_output_contents by output index. Users who have tritonclient call the
server with it unchanged (docs/serving.md); this file is the same exchange without it.

    from kserve_client import KServeClient
    client = KServeClient("127.0.0.1:8500")
    client.server_ready(), client.model_metadata(), client.model_config()
    out = client.infer(cubes)          # numpy int16/float32, (N, C, D, H, W)
    out["Omega_M"]                     # numpy float32 (N, 1); "<name>_sigma", "covariance" too

Command line (prints what `cosmoflow-client predict --json` prints for the same cube, the
uncertainty included when the model has one):
    python3 kserve_client.py --address 127.0.0.1:8500 --npy cube.npy
Exit codes: 0 ok, 1 the server refused (the gRPC status on stderr), 2 usage or input file.
"""
import argparse
import json
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cosmoflow_client import MAX_MESSAGE_BYTES, load_stubs  # noqa: E402

pb, pb_grpc = load_stubs(["kserve_v2"])

MODEL = "cosmoflow"
_DATATYPES = {np.dtype(np.int16): "INT16", np.dtype(np.float32): "FP32"}


class KServeClient:
    def __init__(self, address, timeout=60.0):
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._timeout = timeout

    def server_live(self):
        return self._stub.ServerLive(pb.ServerLiveRequest(), timeout=self._timeout).live

    def server_ready(self):
        return self._stub.ServerReady(pb.ServerReadyRequest(), timeout=self._timeout).ready

    def model_ready(self, version=""):
        req = pb.ModelReadyRequest(name=MODEL, version=version)
        return self._stub.ModelReady(req, timeout=self._timeout).ready

    def model_metadata(self):
        return self._stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL), timeout=self._timeout)

    def model_config(self):
        return self._stub.ModelConfig(pb.ModelConfigRequest(name=MODEL), timeout=self._timeout).config

    def infer(self, cubes, outputs=None, request_id=""):
        """{output name: numpy float32 array} for the cubes (N, C, D, H, W); `outputs` names the
        wanted outputs (default: all of the model's, as ModelMetadata lists them)."""
        cubes = np.asarray(cubes)
        if cubes.dtype not in _DATATYPES or cubes.ndim != 5:
            raise ValueError("cubes must be int16 or float32 with shape (N, C, D, H, W), not %s %s"
                             % (cubes.dtype, cubes.shape))
        tensor = pb.ModelInferRequest.InferInputTensor(
            name="cube", datatype=_DATATYPES[cubes.dtype], shape=list(cubes.shape))
        req = pb.ModelInferRequest(model_name=MODEL, model_version="", id=request_id, inputs=[tensor])
        for name in outputs or []:
            req.outputs.add(name=name)
        little = cubes.astype(cubes.dtype.newbyteorder("<"), copy=False)
        req.raw_input_contents.append(np.ascontiguousarray(little).tobytes())
        resp = self._stub.ModelInfer(req, timeout=self._timeout)
        return {out.name: np.frombuffer(resp.raw_output_contents[i], dtype="<f4").reshape(out.shape)
                for i, out in enumerate(resp.outputs)}, resp.model_version


def _as_client_json(outputs, version, names):
    """The answer for one cube in cosmoflow-client's --json form."""
    result = {"model_version": version,
              "parameters": {n: float(outputs[n][0, 0]) for n in names}}
    if "covariance" in outputs:
        result["sigma"] = {n: float(outputs[n + "_sigma"][0, 0]) for n in names}
        result["covariance"] = outputs["covariance"][0].astype(float).tolist()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="127.0.0.1:8500")
    ap.add_argument("--npy", required=True, help="one cube, (D,H,W) or (C,D,H,W), int16 or float32")
    args = ap.parse_args()
    try:
        cube = np.load(args.npy)
    except (OSError, ValueError) as e:
        print("kserve_client: cannot read %s: %s" % (args.npy, e), file=sys.stderr)
        return 2
    if cube.ndim == 3:
        cube = cube[np.newaxis]
    client = KServeClient(args.address)
    try:
        meta = client.model_metadata()
        names = [o.name for o in meta.outputs if not o.name.endswith("_sigma") and o.name != "covariance"]
        outputs, version = client.infer(cube[np.newaxis])
    except grpc.RpcError as e:
        print("kserve_client: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
        return 1
    except ValueError as e:
        print("kserve_client: %s" % e, file=sys.stderr)
        return 2
    print(json.dumps(_as_client_json(outputs, version, names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
