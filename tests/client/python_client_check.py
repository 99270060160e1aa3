#!/usr/bin/python3
"""Drives client/python/cosmoflow_client.py against a running server (started by client_test):
predict, predict_batch and predict_stream must agree; prints the single prediction as JSON."""
import json
import sys

sys.path.insert(0, sys.argv[1])  # client/python
import numpy as np  # noqa: E402
from cosmoflow_client import CosmoFlowClient  # noqa: E402

address, npy = sys.argv[2], sys.argv[3]
client = CosmoFlowClient(address, timeout=30)
assert client.health() == "SERVING", client.health()
cube = np.load(npy)
single = client.predict(cube, request_id="py")
assert single["request_id"] == "py"
cubes = [cube, np.ascontiguousarray(cube[:, ::-1]), cube.astype(np.float32)]
batch = client.predict_batch(cubes)
stream = dict(client.predict_stream(cubes))
for i, c in enumerate(cubes):
    one = client.predict(c)["parameters"]
    assert batch[i]["parameters"] == one or all(abs(batch[i]["parameters"][k] - v) < 1e-6 for k, v in one.items()), (i, batch[i], one)
    assert isinstance(stream[i], dict), stream[i]
    assert all(abs(stream[i]["parameters"][k] - v) < 1e-6 for k, v in one.items()), (i, stream[i], one)
# Many more cubes than the server's queue holds (client_test gives it 4 slots): the stream paces
# itself with its window, so none of them is refused with RESOURCE_EXHAUSTED.
many = dict(client.predict_stream([cube] * 40, window=4))
assert len(many) == 40, len(many)
bad = {i: r for i, r in many.items() if not isinstance(r, dict)}
assert not bad, bad
try:
    list(client.predict_stream(cubes, window=0))
    raise AssertionError("window=0 accepted")
except ValueError:
    pass
print(json.dumps(single))
