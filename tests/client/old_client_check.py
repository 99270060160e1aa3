#!/usr/bin/python3
"""A client generated from an older cosmoflow.proto (without sigma and covariance) against today's
server: Predict, PredictBatch, PredictStream and GetModelInfo must all work and agree. Prints the
single prediction's values as JSON {name: value}, for the caller to compare with a new client's.

Usage: old_client_check.py OLD_PROTO_DIR STUBS_DIR ADDRESS CUBE.npy
"""
import json
import subprocess
import sys

old_proto_dir, stubs, address, npy = sys.argv[1:5]
subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", old_proto_dir, "--python_out=" + stubs,
                "--grpc_python_out=" + stubs, old_proto_dir + "/cosmoflow.proto"], check=True)
sys.path.insert(0, stubs)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import cosmoflow_pb2 as pb  # noqa: E402
import cosmoflow_pb2_grpc as pb_grpc  # noqa: E402

# The old contract really is the old one: it has no sigma, no covariance.
assert "sigma" not in pb.Parameter.DESCRIPTOR.fields_by_name, "OLD_PROTO_DIR holds the new proto"
assert "covariance" not in pb.PredictResponse.DESCRIPTOR.fields_by_name

cube = np.load(npy).astype("<i2")
msg = pb.Cube(shape=[1] + list(cube.shape), dtype=pb.DTYPE_INT16, data=cube.tobytes())
options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
stub = pb_grpc.CosmoFlowStub(grpc.insecure_channel(address, options))
info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
assert info.version and list(info.input_shape) == [1] + list(cube.shape), info
single = stub.Predict(pb.PredictRequest(request_id="old", cube=msg), timeout=30)
assert single.request_id == "old" and len(single.parameters) == 3, single
values = {p.name: p.value for p in single.parameters}
batch = stub.PredictBatch(pb.PredictBatchRequest(requests=[pb.PredictRequest(cube=msg)] * 2), timeout=30)
stream = list(stub.PredictStream(iter([pb.PredictRequest(request_id="s", cube=msg)]), timeout=30))
assert len(stream) == 1 and stream[0].code == 0, stream
# Batch and stream requests may run in a network of another batch size, whose kernels block the
# work differently (oneDNN's as ours): equal to fp32 rounding, not bit for bit.
for r in list(batch.responses) + [stream[0].result]:
    got = {p.name: p.value for p in r.parameters}
    assert got.keys() == values.keys() and all(abs(got[k] - v) <= 1e-5 * (1 + abs(v)) for k, v in values.items()), \
        (r, values)
print(json.dumps(values))
