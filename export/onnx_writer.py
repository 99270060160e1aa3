"""Builds the ONNX graph of a layer plan (checkpoint_plan.py) with onnx.helper (python3-onnx).

Graph: input `counts` float32 [batch, C, D, H, W] (raw particle counts; int16 counts convert
exactly), the spec's input transform, the layers, the label de-normalisation, output `parameters`
float32 [batch, P] in physical units, columns in the order of the spec's outputs (also listed in
the model's metadata_props). The batch dimension is symbolic ("batch").
"""

import json

import numpy as np

OPSET = 17  # the newest python3-onnx 1.12 knows; ReduceMean still takes axes as an attribute here


class _Graph:
    def __init__(self):
        import onnx.helper  # noqa: F401 (fails early with a clear ImportError)
        self.nodes, self.initializers, self.used = [], [], {"counts", "parameters"}

    def name(self, hint):
        """`hint` itself the first time (checkpoint tensor names stay recognisable), then hint_2, ..."""
        name, k = hint, 1
        while name in self.used:
            k += 1
            name = f"{hint}_{k}"
        self.used.add(name)
        return name

    def const(self, hint, array):
        from onnx import numpy_helper
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type, inputs, hint, **attrs):
        from onnx import helper
        out = self.name(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def _transform(g, x, transform):
    """core/nn/spec.cc's input transforms: the channel mean in double, its reciprocal rounded to
    float32, an empty channel multiplied by 0 instead of divided by 0."""
    from onnx import TensorProto
    if transform == "none":
        return x
    if transform == "log1p":
        return g.op("Log", [g.op("Add", [x, g.const("one", np.float32(1.0))], "plus_one")], "log1p")
    mean = g.op("ReduceMean", [g.op("Cast", [x], "counts_f64", to=TensorProto.DOUBLE)], "channel_mean",
                axes=[2, 3, 4], keepdims=1)
    zero = g.const("zero_f64", np.float64(0.0))
    inv = g.op("Where", [g.op("Greater", [mean, zero], "nonempty"), g.op("Reciprocal", [mean], "inv_mean"), zero],
               "inv_or_zero")
    y = g.op("Mul", [x, g.op("Cast", [inv], "inv_f32", to=TensorProto.FLOAT)], "divide_by_mean")
    if transform == "overdensity":
        y = g.op("Sub", [y, g.const("one", np.float32(1.0))], "overdensity")
    return y


def _layer(g, x, e, weights):
    kind = e["type"]
    if kind == "conv3d":
        pads = [e["pad_left"]] * 3 + [e["pad_right"]] * 3  # ONNX: all begins, then all ends
        return g.op("Conv", [x, g.const(e["name"] + ".weights", weights[e["name"] + ".weights"]),
                             g.const(e["name"] + ".bias", weights[e["name"] + ".bias"])], e["name"],
                    kernel_shape=[e["kernel"]] * 3, strides=[e["stride"]] * 3, pads=pads)
    if kind in ("avg_pool", "max_pool"):
        op = "AveragePool" if kind == "avg_pool" else "MaxPool"
        return g.op(op, [x], kind, kernel_shape=[e["size"]] * 3, strides=[e["size"]] * 3, ceil_mode=0)
    if kind == "leaky_relu":
        return g.op("LeakyRelu", [x], "leaky_relu", alpha=e["alpha"])
    if kind == "dropout":
        return x  # inference: identity
    if kind == "flatten":
        return g.op("Flatten", [x], "flatten", axis=1)  # NCDHW order, as the dense weights expect
    if kind == "dense":
        return g.op("Gemm", [x, g.const(e["name"] + ".weights", weights[e["name"] + ".weights"]),
                             g.const(e["name"] + ".bias", weights[e["name"] + ".bias"])], e["name"], transB=1)
    if kind == "batch_norm":
        inputs = [x] + [g.const(f"{e['name']}.{s}", weights[f"{e['name']}.{s}"])
                        for s in ("gamma", "beta", "running_mean", "running_var")]
        return g.op("BatchNormalization", inputs, e["name"], epsilon=e["epsilon"], momentum=1.0 - e["momentum"])
    if kind == "scaled_tanh":
        return g.op("Mul", [g.op("Tanh", [x], "tanh"), g.const("tanh_scale", np.float32(e["scale"]))],
                    "scaled_tanh")
    raise AssertionError(f"layer type {kind} missing from the ONNX writer")


def build_model(plan, weights, info):
    """The checked onnx.ModelProto. `info` (dict of strings) goes into metadata_props."""
    import onnx
    from onnx import TensorProto, helper
    g = _Graph()
    c, s = plan["input_channels"], plan["input_side"]
    counts = helper.make_tensor_value_info("counts", TensorProto.FLOAT, ["batch", c, s, s, s])
    x = _transform(g, "counts", plan["input_transform"])
    for e in plan["layers"]:
        x = _layer(g, x, e, weights)
    outs = plan["outputs"]
    scale = g.const("label_scale", np.array([o["scale"] for o in outs], dtype=np.float32))
    offset = g.const("label_offset", np.array([o["offset"] for o in outs], dtype=np.float32))
    physical = g.op("Add", [g.op("Mul", [x, scale], "scaled"), offset], "physical")
    g.nodes.append(helper.make_node("Identity", [physical], ["parameters"], name="parameters"))
    parameters = helper.make_tensor_value_info("parameters", TensorProto.FLOAT, ["batch", len(outs)])
    graph = helper.make_graph(g.nodes, plan["name"] or "cosmoflow", [counts], [parameters], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="cosmoflow-export", doc_string=_doc(plan))
    model.ir_version = 8  # what onnx 1.12 writes for opset 17; onnxruntime >= 1.10 reads it
    meta = dict(info, outputs=",".join(o["name"] for o in outs), units=json.dumps([o["unit"] for o in outs]),
                input_transform=plan["input_transform"])
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model, full_check=True)
    return model


def _doc(plan):
    names = ", ".join(o["name"] for o in plan["outputs"])
    return (f"CosmoFlow model '{plan['name']}'. Input 'counts': float32 particle counts [batch, C, D, H, W]; "
            f"the input transform ({plan['input_transform']}) and the label de-normalisation are inside the "
            f"graph. Output 'parameters': [batch, {len(plan['outputs'])}] physical values of {names}.")
