"""Node building for the ONNX export (`export_onnx.py`): one `Nodes` list per graph or function body.

`Nodes.op(type, *inputs, **attrs)` appends a node and returns its output name(s); constants are
`Constant` nodes (deduplicated per body), so a function body and the main graph are built the
same way. Helpers spell the few patterns the op tables repeat (casts, 1-d int64 shape vectors,
scalars of a dtype). `ONNX_DTYPE` maps IR dtypes to ONNX element types: the one-byte formats
ONNX has no type for here (`e8m0`, packed `fp4e2m1x2`) travel as their raw bytes (UINT8).
Known gaps: none of its own.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

OPSET = 21          # the standard domain's version (onnxruntime >= 1.18 runs it)
DOMAIN = "dsv41"    # the custom domain of the domain ops' functions
IR_VERSION = 10     # the ONNX IR version the model is stamped with (function overloads need 10)

ONNX_DTYPE = {"f64": TP.DOUBLE, "f32": TP.FLOAT, "bf16": TP.BFLOAT16, "f16": TP.FLOAT16,
              "fp8e4m3": TP.UINT8, "e8m0": TP.UINT8, "fp4e2m1x2": TP.UINT8, "i8": TP.INT8, "u8": TP.UINT8,
              "i32": TP.INT32, "i64": TP.INT64, "bool": TP.BOOL}
NP_DTYPE = {TP.DOUBLE: np.float64, TP.FLOAT: np.float32, TP.FLOAT16: np.float16, TP.INT8: np.int8,
            TP.UINT8: np.uint8, TP.INT32: np.int32, TP.INT64: np.int64, TP.BOOL: np.bool_}
FLOATS = (TP.DOUBLE, TP.FLOAT, TP.BFLOAT16, TP.FLOAT16)
I64_MAX = np.iinfo(np.int64).max


def onnx_dtype(dt) -> int:
    return ONNX_DTYPE[dt.name if hasattr(dt, "name") else str(dt)]


class Nodes:
    """The nodes of one graph or function body, with fresh value names under `prefix`."""

    def __init__(self, prefix: str = ""):
        self.prefix, self.nodes, self._n, self._consts = prefix, [], 0, {}

    def fresh(self, hint: str = "t") -> str:
        self._n += 1
        return f"{self.prefix}{hint}_{self._n}"

    def op(self, op_type: str, *inputs, outs: int = 1, out_names=None, domain: str = "", overload: str = "",
           **attrs):
        names = list(out_names) if out_names else [self.fresh(op_type.lower()) for _ in range(outs)]
        node = helper.make_node(op_type, [i or "" for i in inputs], names, domain=domain or None,
                                name=f"{self.prefix}n{len(self.nodes)}_{op_type}", **attrs)
        if overload:
            node.overload = overload
        self.nodes.append(node)
        return names[0] if len(names) == 1 else names

    def const(self, value, dtype: int) -> str:
        arr = np.asarray(value, dtype=NP_DTYPE[dtype])
        key = (dtype, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.op("Constant", value=numpy_helper.from_array(arr, self.fresh("c")))
        return self._consts[key]

    def i64(self, *vals) -> str:
        """A 1-d INT64 constant (shapes, axes, starts, ends)."""
        return self.const(list(vals), TP.INT64)

    def scalar(self, v, dtype: int) -> str:
        """A 0-d constant of `dtype` (a float of a bfloat16 computation is made in float and cast)."""
        if dtype == TP.BFLOAT16:
            return self.cast(self.const(v, TP.FLOAT), TP.BFLOAT16)
        return self.const(v, dtype)

    def cast(self, x: str, to: int, frm: int | None = None) -> str:
        return x if frm == to else self.op("Cast", x, to=to)

    def dim(self, x: str, i: int) -> str:
        """Dim i of x as a 1-d INT64 [1]."""
        return self.op("Shape", x, start=i) if i == -1 else self.op("Shape", x, start=i, end=i + 1)

    def squeeze0(self, x: str) -> str:
        """A 1-d [1] tensor as a 0-d scalar."""
        return self.op("Squeeze", x, self.i64(0))

    def rsqrt(self, x: str) -> str:
        return self.op("Reciprocal", self.op("Sqrt", x))

    def mean_last(self, x: str, keep: int = 1) -> str:
        return self.op("ReduceMean", x, self.i64(-1), keepdims=keep)

    def slice(self, x: str, axis: int, start=None, end=None) -> str:
        """x[start:end] along axis; start/end are ints or 1-d INT64 names (None: the edge)."""
        s = self.i64(0) if start is None else self.i64(start) if isinstance(start, int) else start
        e = self.i64(I64_MAX) if end is None else self.i64(end) if isinstance(end, int) else end
        return self.op("Slice", x, s, e, self.i64(axis))
