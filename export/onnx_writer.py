"""Builds the ONNX graph of a layer plan (checkpoint_plan.py) with onnx.helper (python3-onnx).

Graph: input `counts` float32 [batch, C, D, H, W] (raw particle counts; int16 counts convert
exactly), the spec's input transform, the layers, the label de-normalisation, output `parameters`
float32 [batch, P] in physical units, columns in the order of the spec's outputs (also listed in
the model's metadata_props). A model with an uncertainty head has a second output `covariance`
float32 [batch, P, P]: the head's Gaussian posterior decoded in float64 (core/nn/uncertainty.cc's
DecodeHead, unrolled over the P outputs), calibrated and de-normalised, as the server serves it.
The batch dimension is symbolic ("batch").
"""

import json

import numpy as np

OPSET = 17  # the newest python3-onnx 1.12 knows; ReduceMean still takes axes as an attribute here


class _Graph:
    def __init__(self):
        import onnx.helper  # noqa: F401 (fails early with a clear ImportError)
        self.nodes, self.initializers, self.used = [], [], {"counts", "parameters", "covariance"}

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


LOG_VARIANCE_LIMIT = 40.0  # core/nn/uncertainty.h


def _clipped_exp(g, x, limit, factor, hint):
    """exp(factor * clip(x, -limit, limit)) in float64."""
    clipped = g.op("Clip", [x, g.const("lo", np.float64(-limit)), g.const("hi", np.float64(limit))], hint + "_clip")
    if factor != 1.0:
        clipped = g.op("Mul", [clipped, g.const("half", np.float64(factor))], hint + "_scaled")
    return g.op("Exp", [clipped], hint)


def _head_entries(g, raw, head, p):
    """{(i, j): [batch] float64 node} of the normalised covariance, as DecodeHead computes it."""
    col = [g.op("Gather", [raw, g.const(f"col{k}", np.array(k, dtype=np.int64))], f"raw{k}", axis=1)
           for k in range(2 * p + p * (p - 1) // 2 if head == "gaussian_full" else 2 * p)]
    zero = g.op("Mul", [col[0], g.const("zero", np.float64(0.0))], "zeros")
    if head == "gaussian":
        return {(i, j): (_clipped_exp(g, col[p + i], LOG_VARIANCE_LIMIT, 1.0, f"var{i}") if i == j else zero)
                for i in range(p) for j in range(p)}
    l = {(i, i): _clipped_exp(g, col[p + i], 0.5 * LOG_VARIANCE_LIMIT, 1.0, f"l{i}{i}") for i in range(p)}
    k = 2 * p
    for i in range(1, p):
        for j in range(i):
            l[i, j] = col[k]
            k += 1
    one = g.op("Add", [zero, g.const("one_f64", np.float64(1.0))], "ones")
    m = {}  # M = L^-1, lower triangular, by forward substitution
    for j in range(p):
        for i in range(j, p):
            v = one if i == j else zero
            for t in range(j, i):
                v = g.op("Sub", [v, g.op("Mul", [l[i, t], m[t, j]], f"lm{i}{t}{j}")], f"v{i}{j}")
            m[i, j] = g.op("Div", [v, l[i, i]], f"m{i}{j}")
    entries = {}
    for i in range(p):
        for j in range(p):
            terms = [g.op("Mul", [m[t, i], m[t, j]], f"mm{t}{i}{j}") for t in range(max(i, j), p)]
            entries[i, j] = terms[0] if len(terms) == 1 else g.op("Sum", terms, f"c{i}{j}")
    return entries


def _edge_factor(g, raw, plan, i):
    """exp(e_i u_i^2), u_i the clamped edge coordinate of normalised mean i ([batch, 1])."""
    mean = g.op("Slice", [raw, g.const(f"edge_at{i}", np.array([i], dtype=np.int64)),
                          g.const(f"edge_to{i}", np.array([i + 1], dtype=np.int64)),
                          g.const(f"edge_axis{i}", np.array([1], dtype=np.int64))], f"edge_mean{i}")
    u = g.op("Div", [g.op("Sub", [mean, g.const(f"edge_c{i}", np.float64(plan["edge_centre"][i]))], f"edge_d{i}"),
                     g.const(f"edge_h{i}", np.float64(plan["edge_half"][i]))], f"edge_u{i}")
    u = g.op("Clip", [u, g.const(f"edge_lo{i}", np.float64(-plan["edge_reach"])), g.const(f"edge_hi{i}", np.float64(plan["edge_reach"]))],
             f"edge_uc{i}")
    e = g.op("Mul", [g.op("Mul", [u, u], f"edge_u2{i}"), g.const(f"edge_e{i}", np.float64(plan["sigma_edge"][i]))],
             f"edge_eu{i}")
    return g.op("Exp", [e], f"edge_f{i}")


def _power_calibrated(g, cov, entries, raw, plan):
    """cov [batch, P, P] times f_i f_j, f_i = s_i (sigma_i / r_i)^(b_i - 1) exp(e_i u_i^2) with sigma_i
    the sqrt of the diagonal entry and u_i the mean's edge coordinate (core/nn/uncertainty.cc's
    ApplyCalibration for a power calibration, with or without an edge term)."""
    p = len(plan["outputs"])
    factors = []  # [batch, 1] each, as the entries
    for i in range(p):
        sigma = g.op("Sqrt", [entries[i, i]], f"sigma{i}")
        ratio = g.op("Div", [sigma, g.const(f"sigma_ref{i}", np.float64(plan["sigma_reference"][i]))], f"ratio{i}")
        powered = g.op("Pow", [ratio, g.const(f"sigma_pow{i}", np.float64(plan["sigma_exponent"][i] - 1.0))], f"pow{i}")
        f = g.op("Mul", [powered, g.const(f"sigma_s{i}", np.float64(plan["sigma_scale"][i]))], f"f{i}")
        if plan.get("sigma_edge") is not None:
            f = g.op("Mul", [f, _edge_factor(g, raw, plan, i)], f"fe{i}")
        factors.append(f)
    f = g.op("Concat", factors, "f_all", axis=1)
    rows = g.op("Unsqueeze", [f, g.const("f_axis2", np.array([2], dtype=np.int64))], "f_rows")
    cols = g.op("Unsqueeze", [f, g.const("f_axis1", np.array([1], dtype=np.int64))], "f_cols")
    return g.op("Mul", [cov, g.op("Mul", [rows, cols], "f_outer")], "cov_calibrated")


def _covariance(g, x, plan):
    """The `covariance` output [batch, P, P] float32 from the head outputs x [batch, W]."""
    from onnx import TensorProto
    p = len(plan["outputs"])
    raw = g.op("Cast", [x], "raw_f64", to=TensorProto.DOUBLE)
    entries = _head_entries(g, raw, plan["uncertainty"], p)
    axis1 = g.const("axis1", np.array([1], dtype=np.int64))
    flat = g.op("Concat", [g.op("Unsqueeze", [entries[i, j], axis1], f"u{i}{j}") for i in range(p) for j in range(p)],
                "cov_flat", axis=1)
    cov = g.op("Reshape", [flat, g.const("cov_shape", np.array([-1, p, p], dtype=np.int64))], "cov_normalised")
    if plan.get("sigma_exponent") is not None:
        cov = _power_calibrated(g, cov, entries, raw, plan)
        factor = np.array([o["scale"] for o in plan["outputs"]], dtype=np.float64)
    else:
        factor = np.array([o["scale"] * c for o, c in zip(plan["outputs"], plan["sigma_scale"])], dtype=np.float64)
    physical = g.op("Mul", [cov, g.const("cov_factor", np.outer(factor, factor))], "cov_physical")
    return g.op("Cast", [physical], "cov_f32", to=TensorProto.FLOAT)


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
    p = len(outs)
    means = x
    if plan["uncertainty"] != "none":
        means = g.op("Slice", [x, g.const("start", np.array([0], dtype=np.int64)),
                               g.const("end", np.array([p], dtype=np.int64)), g.const("axes", np.array([1], dtype=np.int64))],
                     "means")
    scale = g.const("label_scale", np.array([o["scale"] for o in outs], dtype=np.float32))
    offset = g.const("label_offset", np.array([o["offset"] for o in outs], dtype=np.float32))
    physical = g.op("Add", [g.op("Mul", [means, scale], "scaled"), offset], "physical")
    g.nodes.append(helper.make_node("Identity", [physical], ["parameters"], name="parameters"))
    outputs = [helper.make_tensor_value_info("parameters", TensorProto.FLOAT, ["batch", p])]
    if plan["uncertainty"] != "none":
        g.nodes.append(helper.make_node("Identity", [_covariance(g, x, plan)], ["covariance"], name="covariance"))
        outputs.append(helper.make_tensor_value_info("covariance", TensorProto.FLOAT, ["batch", p, p]))
    graph = helper.make_graph(g.nodes, plan["name"] or "cosmoflow", [counts], outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="cosmoflow-export", doc_string=_doc(plan))
    model.ir_version = 8  # what onnx 1.12 writes for opset 17; onnxruntime >= 1.10 reads it
    meta = dict(info, outputs=",".join(o["name"] for o in outs), units=json.dumps([o["unit"] for o in outs]),
                input_transform=plan["input_transform"], uncertainty=plan["uncertainty"],
                sigma_scale=json.dumps(plan["sigma_scale"]),
                sigma_exponent=json.dumps(plan.get("sigma_exponent")),
                sigma_reference=json.dumps(plan.get("sigma_reference")),
                sigma_edge=json.dumps(plan.get("sigma_edge")))
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model, full_check=True)
    return model


def _doc(plan):
    names = ", ".join(o["name"] for o in plan["outputs"])
    return (f"CosmoFlow model '{plan['name']}'. Input 'counts': float32 particle counts [batch, C, D, H, W]; "
            f"the input transform ({plan['input_transform']}) and the label de-normalisation are inside the "
            f"graph. Output 'parameters': [batch, {len(plan['outputs'])}] physical values of {names}."
            + ("" if plan["uncertainty"] == "none" else
               f" Output 'covariance': [batch, P, P], the calibrated posterior covariance ({plan['uncertainty']} head)."))
