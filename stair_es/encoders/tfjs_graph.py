"""Run a TensorFlow.js *graph model* (``model.json`` + weight shards) as a PyTorch module.

Several small vision models are published only in the TensorFlow.js format, on the npm
registry (the ``objects`` token source's COCO detector is one). A graph model is a frozen
TensorFlow ``GraphDef`` written as JSON (``modelTopology.node``: name, op, inputs, attributes)
plus a ``weightsManifest`` that says how the binary shards hold each constant (dtype, shape,
and optionally a ``quantization`` such as float16 or affine uint8). This module reads both
and executes the nodes that the requested outputs depend on, in topological order, with
``torch.nn.functional`` -- so the module can be exported once to ONNX by
:mod:`stair_es.encoders.runtime` like every other tower, and TensorFlow is never needed.

Layout: TensorFlow graphs here are NHWC; tensors are kept NCHW inside (what ``conv2d`` wants)
and every axis attribute is mapped (``NHWC axis a -> NCHW [0, 2, 3, 1][a]``). Only the ops the
supported models use are implemented (convolutions with their fused bias/activation,
depthwise convolutions, element-wise arithmetic, ReLU/ReLU6/sigmoid, mean, concat, legacy
bilinear resize, max-pool, padding, reshape, clipping, softmax, dense
layers); any other op raises a :class:`ModelError` that names it, at load
time, never a wrong answer. ``SAME`` padding follows TensorFlow (the extra row/column goes at
the bottom/right), and ``ResizeBilinear`` with neither ``align_corners`` nor
``half_pixel_centers`` samples at ``out * in / out_size`` as TensorFlow 1 did (PyTorch's
``align_corners=False`` differs by half a pixel).

This module must not know what a model means: callers name the outputs they want.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError

#: ops this interpreter runs
SUPPORTED_OPS = frozenset({"Const", "Placeholder", "Identity", "_FusedConv2D", "Conv2D", "FusedDepthwiseConv2dNative",
                           "DepthwiseConv2dNative", "Add", "AddV2", "Sub", "Mul", "Relu", "Relu6", "Sigmoid", "Mean",
                           "ConcatV2", "ResizeBilinear", "MaxPool", "Pad", "Reshape", "Minimum", "Maximum",
                           "_FusedMatMul", "Softmax"})
_CONVS = ("_FusedConv2D", "Conv2D", "FusedDepthwiseConv2dNative", "DepthwiseConv2dNative")
_NCHW_AXIS = (0, 2, 3, 1)


def _name(ref: str) -> str:
    """A node input reference (``node:1``, ``^control``) -> the node's name."""
    return ref.lstrip("^").split(":")[0]


def _text(attr: dict[str, Any], key: str) -> str:
    return base64.b64decode(attr.get(key, {}).get("s", "")).decode("ascii", "replace")


def _ints(attr: dict[str, Any], key: str, default: list[int]) -> list[int]:
    return [int(x) for x in attr.get(key, {}).get("list", {}).get("i", [])] or default


def _texts(attr: dict[str, Any], key: str) -> list[str]:
    return [base64.b64decode(s).decode("ascii", "replace") for s in attr.get(key, {}).get("list", {}).get("s", [])]


def read_graph_model(model_json: Path) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """(nodes by name, constants by name) of a graph model; shards are read beside the JSON."""
    try:
        spec = json.loads(Path(model_json).read_text("utf-8"))
        nodes = {n["name"]: n for n in spec["modelTopology"]["node"]}
        groups = spec["weightsManifest"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{model_json} is not a TensorFlow.js graph model ({type(e).__name__}: {e})") from None
    consts: dict[str, np.ndarray] = {}
    for group in groups:
        try:
            buf = b"".join((Path(model_json).parent / p).read_bytes() for p in group["paths"])
        except OSError as e:
            raise ModelError(f"a weight shard of {model_json} cannot be read: {e.strerror or e}") from None
        offset = 0
        for w in group["weights"]:
            shape = [int(s) for s in w["shape"]]
            count = int(np.prod(shape)) if shape else 1
            quant = w.get("quantization")
            dtype = np.dtype(quant["dtype"] if quant else w["dtype"])
            end = offset + count * dtype.itemsize
            if end > len(buf):
                raise ModelError(f"the weight shards of {model_json} are shorter than its manifest says (truncated?)")
            arr = np.frombuffer(buf, dtype, count, offset)
            if quant and quant["dtype"] in ("uint8", "uint16"):
                arr = arr.astype(np.float32) * float(quant["scale"]) + float(quant["min"])
            elif quant:
                arr = arr.astype(np.float32)
            consts[w["name"]] = np.array(arr).reshape(shape)
            offset = end
    return nodes, consts


def graph_module(model_json: Path, outputs: list[str]) -> Any:
    """A ``torch.nn.Module`` computing ``outputs`` (node names) from the graph's one placeholder,
    given as an NCHW float tensor."""
    import torch
    import torch.nn.functional as F

    nodes, consts = read_graph_model(model_json)
    order = _topological_order(nodes, outputs, model_json)
    unsupported = sorted({nodes[n]["op"] for n in order} - SUPPORTED_OPS)
    if unsupported:
        raise ModelError(f"{model_json} uses TensorFlow ops stair_es cannot run: {', '.join(unsupported)}")

    declared = _declared_hw(nodes)
    unary = {"Relu": F.relu, "Relu6": F.relu6, "Sigmoid": torch.sigmoid, "Identity": lambda t: t}
    binary = {"Add": torch.add, "AddV2": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Minimum": torch.minimum,
              "Maximum": torch.maximum}

    def tensor(a: np.ndarray) -> Any:
        if a.ndim == 1 and a.size > 1:  # a per-channel vector broadcasts over NHWC's last axis
            a = a.reshape(1, -1, 1, 1)
        elif a.ndim == 4:
            a = a.transpose(0, 3, 1, 2)
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    class GraphModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterDict()
            self.keys: dict[str, str] = {}
            # conv weights and biases are laid out for conv2d; every other float constant for NCHW
            for name in sorted(order, key=lambda n: nodes[n]["op"] == "Const"):
                node = nodes[name]
                ins = [_name(i) for i in node.get("input", []) if not i.startswith("^")]
                if node["op"] in _CONVS:
                    w = consts[ins[1]]
                    if "Depthwise" in node["op"]:  # H, W, C, multiplier -> C * multiplier, 1, H, W
                        kh, kw, c, m = w.shape
                        w = w.transpose(2, 3, 0, 1).reshape(c * m, 1, kh, kw)
                    else:  # H, W, in, out -> out, in, H, W
                        w = w.transpose(3, 2, 0, 1)
                    self._keep(ins[1], torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)))
                    for extra in ins[2:]:
                        self._keep(extra, torch.from_numpy(np.ascontiguousarray(consts[extra], dtype=np.float32)))
                elif node["op"] == "_FusedMatMul":  # a dense layer: kernel (in, out) and bias (out,) as they are
                    for c in ins[1:]:
                        self._keep(c, torch.from_numpy(np.ascontiguousarray(consts[c], dtype=np.float32)))
                elif node["op"] == "Const" and consts.get(name) is not None and consts[name].dtype.kind == "f":
                    if name not in self.keys:
                        self._keep(name, tensor(consts[name]))

        def _keep(self, name: str, value: Any) -> None:
            key = self.keys.setdefault(name, f"w{len(self.keys)}")
            self.weights[key] = torch.nn.Parameter(value, requires_grad=False)

        def const(self, name: str) -> Any:
            return self.weights[self.keys[name]]

        def forward(self, x: Any) -> Any:
            values: dict[str, Any] = {}
            for name in order:
                node = nodes[name]
                op, attr = node["op"], node.get("attr", {})
                ins = [_name(i) for i in node.get("input", []) if not i.startswith("^")]

                def arg(i: int, ins: list[str] = ins) -> Any:  # (bound now: called within this node only)
                    return values[ins[i]] if ins[i] in values else self.const(ins[i])

                if op == "Const":
                    continue
                if op == "Placeholder":
                    values[name] = x
                elif op in _CONVS:
                    values[name] = self._conv(op, attr, arg(0), self.const(ins[1]), ins)
                elif op in binary:
                    values[name] = binary[op](arg(0), arg(1))
                elif op in unary:
                    values[name] = unary[op](arg(0))
                elif op == "Softmax":  # over TensorFlow's last axis: channels of a 4-D tensor
                    values[name] = torch.softmax(arg(0), dim=1 if arg(0).dim() == 4 else -1)
                elif op == "_FusedMatMul":
                    values[name] = self._matmul(attr, arg(0), ins)
                elif op == "Pad":  # NHWC paddings -> F.pad's (W, H, C) pairs
                    p = np.asarray(consts[ins[1]]).reshape(4, 2).astype(int)
                    if p[0].any():
                        raise ModelError(f"{model_json}: padding along the batch axis is not supported")
                    values[name] = F.pad(arg(0), tuple(int(v) for v in (*p[2], *p[1], *p[3])))
                elif op == "Reshape":  # to TensorFlow's shape, from NHWC order
                    inp = arg(0)
                    if inp.dim() == 4:
                        inp = inp.permute(0, 2, 3, 1)
                    shape = [int(v) for v in np.atleast_1d(consts[ins[1]])]
                    if shape[0] == 1 and -1 not in shape[1:]:  # a batch of 1 frozen in: any batch
                        rest = shape[1:]
                        if len(rest) >= 2 and int(np.prod(rest)) != int(np.prod(inp.shape[1:])):
                            rest = [-1, *rest[1:]]  # frozen for another input size: its first axis follows
                        values[name] = inp.reshape(inp.shape[0], *rest)
                    else:
                        values[name] = inp.reshape(shape)
                elif op == "Mean":
                    axes = [_NCHW_AXIS[int(a)] for a in np.atleast_1d(consts[ins[1]])]
                    values[name] = arg(0).mean(dim=axes, keepdim=bool(attr.get("keep_dims", {}).get("b", False)))
                elif op == "ConcatV2":
                    axis = _NCHW_AXIS[int(consts[ins[-1]])]
                    values[name] = torch.cat([arg(i) for i in range(len(ins) - 1)], dim=axis)
                elif op == "ResizeBilinear":
                    values[name] = self._resize(arg(0), consts[ins[1]], attr, int(x.shape[2]), int(x.shape[3]))
                elif op == "MaxPool":
                    k, s = _ints(attr, "ksize", [1, 1, 1, 1]), _ints(attr, "strides", [1, 1, 1, 1])
                    inp = arg(0)
                    if _text(attr, "padding") == "SAME":
                        inp = _same_pad(F, inp, k[1], k[2], s[1], s[2], value=float("-inf"))
                    values[name] = F.max_pool2d(inp, (k[1], k[2]), (s[1], s[2]))
            return tuple(values[o] for o in outputs)

        def _conv(self, op: str, attr: dict[str, Any], inp: Any, w: Any, ins: list[str]) -> Any:
            strides = _ints(attr, "strides", [1, 1, 1, 1])
            dil = _ints(attr, "dilations", [1, 1, 1, 1])
            if _text(attr, "data_format") not in ("", "NHWC"):
                raise ModelError(f"{model_json}: data_format {_text(attr, 'data_format')!r} is not supported")
            if _text(attr, "padding") == "SAME":
                inp = _same_pad(F, inp, w.shape[2], w.shape[3], strides[1], strides[2], dil[1], dil[2])
            elif _text(attr, "padding") != "VALID":
                raise ModelError(f"{model_json}: padding {_text(attr, 'padding')!r} is not supported")
            groups = int(inp.shape[1]) if "Depthwise" in op else 1
            y = F.conv2d(inp, w, None, (strides[1], strides[2]), 0, (dil[1], dil[2]), groups)
            return self._fused(attr, y, self.const(ins[2]).view(1, -1, 1, 1) if len(ins) > 2 else None,
                               ("Relu", "Relu6", "Sigmoid"))

        def _matmul(self, attr: dict[str, Any], inp: Any, ins: list[str]) -> Any:
            if attr.get("transpose_a", {}).get("b") or attr.get("transpose_b", {}).get("b"):
                raise ModelError(f"{model_json}: transposed matrix products are not supported")
            return self._fused(attr, inp @ self.const(ins[1]), self.const(ins[2]) if len(ins) > 2 else None, ("Relu",))

        def _fused(self, attr: dict[str, Any], y: Any, bias: Any, activations: tuple[str, ...]) -> Any:
            """The ops fused into a convolution or matrix product: a bias, then the ``activations`` it allows."""
            for fused in _texts(attr, "fused_ops"):
                if fused == "BiasAdd":
                    y = y + bias
                elif fused in activations:
                    y = unary[fused](y)
                else:
                    raise ModelError(f"{model_json}: fused op {fused!r} is not supported")
            return y

        @staticmethod
        def _resize(inp: Any, size: np.ndarray, attr: dict[str, Any], in_h: int, in_w: int) -> Any:
            if attr.get("align_corners", {}).get("b") or attr.get("half_pixel_centers", {}).get("b"):
                raise ModelError(f"{model_json}: only TensorFlow 1's default bilinear resize is supported")
            # the sizes were frozen for the declared input: scale them to the input given
            out_h = int(round(int(size[0]) * in_h / declared[0])) if declared else int(size[0])
            out_w = int(round(int(size[1]) * in_w / declared[1])) if declared else int(size[1])
            return _legacy_resize(torch, inp, out_h, out_w)

    return GraphModule().eval()


def _topological_order(nodes: dict[str, dict[str, Any]], outputs: list[str], model_json: Path) -> list[str]:
    """The nodes ``outputs`` depend on, each after its inputs (an explicit stack: a deep graph
    never meets Python's recursion limit)."""
    order: list[str] = []
    done: set[str] = set()
    pending: set[str] = set()  # inputs being visited: meeting one again is a cycle
    for out in outputs:
        stack = [(out, False)]
        while stack:
            name, inputs_done = stack.pop()
            if name in done:
                continue
            if inputs_done:
                pending.discard(name)
                done.add(name)
                order.append(name)
                continue
            if name not in nodes:
                raise ModelError(f"{model_json}: node {name!r} is referenced but not defined")
            if name in pending:
                raise ModelError(f"{model_json}: node {name!r} depends on itself (a loop stair_es cannot run)")
            pending.add(name)
            stack.append((name, True))
            stack.extend((_name(ref), False) for ref in reversed(nodes[name].get("input", [])) if not ref.startswith("^"))
    return order


def _declared_hw(nodes: dict[str, dict[str, Any]]) -> tuple[int, int] | None:
    """The (height, width) the graph's NHWC placeholder declares, when it declares them."""
    for node in nodes.values():
        if node["op"] == "Placeholder":
            dims = node.get("attr", {}).get("shape", {}).get("shape", {}).get("dim", [])
            sizes = [int(d.get("size", -1)) for d in dims]
            if len(sizes) == 4 and sizes[1] > 0 and sizes[2] > 0:
                return sizes[1], sizes[2]
    return None


def _same_pad(F: Any, x: Any, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1,
              value: float = 0.0) -> Any:
    """TensorFlow's SAME padding: output = ceil(input / stride), the odd extra pixel at the end."""
    h, w = int(x.shape[2]), int(x.shape[3])  # ints: an exported graph pads by constants, not shape arithmetic
    ph = max((-(-h // sh) - 1) * sh + (kh - 1) * dh + 1 - h, 0)
    pw = max((-(-w // sw) - 1) * sw + (kw - 1) * dw + 1 - w, 0)
    if not ph and not pw:
        return x
    return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=value)


def _legacy_resize(torch: Any, x: Any, out_h: int, out_w: int) -> Any:
    """Bilinear resize sampling input row ``i * in / out`` for output row ``i`` (TensorFlow 1), as
    two products with interpolation matrices (``out x in``, two weights a row): ONNX Runtime runs
    them as matrix products, where gathering the rows and columns cost a third of the COCO
    detector's time (its ``x2`` upsamplings, whose weights 0 and 0.5 make both forms give the same
    bits: checked on the photos set)."""

    def matrix(out: int, size: int) -> Any:
        src = torch.arange(out, dtype=torch.float32) * (size / out)
        lo = src.floor().long().clamp(max=size - 1)
        hi = (lo + 1).clamp(max=size - 1)
        f = src - lo.float()
        rows = torch.arange(out)
        m = torch.zeros(out, size)
        m[rows, lo] += 1 - f
        m[rows, hi] += f  # (lo == hi at the clamped edge: the weights add up to 1 there)
        return m

    return torch.matmul(torch.matmul(matrix(out_h, int(x.shape[2])), x), matrix(out_w, int(x.shape[3])).t())
