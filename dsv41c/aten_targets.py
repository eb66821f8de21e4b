"""What an ATen target of a plan can do, read from its schemas: write into a given tensor, make one on a device.

    aten_target("aten.mul")            # the overload packet (or overload: "aten.slice.Tensor"), or None
    out_form(fn)   -> "out" | "copy" | None      an out= overload exists / `_to_copy` (copy into it) / neither
    takes_device(fn) -> bool                      makes a tensor from no tensor, on a device it is told

A leaf both sides share: the compiler (codegen/cpu.py) decides from it which placed values the
runtime's arena will hold, and the runtime (runtime/arena.py, runtime/executor.py) writes them.
"""
from __future__ import annotations

import torch


def aten_target(name: str):
    """`aten.x` / `aten.x.overload` -> the torch.ops object, or None if this torch has none."""
    ns, _, rest = name.partition(".")
    if ns != "aten" or not rest:
        return None
    obj = torch.ops.aten
    try:
        for part in rest.split("."):
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return None
    return obj


def out_form(fn) -> str | None:
    """How an ATen target writes into a given tensor: "out" (an overload with an `out` argument),
    "copy" (`_to_copy`), or None."""
    packet = fn.overloadpacket if isinstance(fn, torch._ops.OpOverload) else fn
    if not isinstance(packet, torch._ops.OpOverloadPacket) or packet._qualified_op_name.split("::")[0] != "aten":
        return None
    if packet._qualified_op_name == "aten::_to_copy":
        return "copy"
    for name in packet.overloads():
        if any(a.name == "out" and a.is_out for a in getattr(packet, name)._schema.arguments):
            return "out"
    return None


def _is_factory(schema) -> bool:
    args = schema.arguments
    return any(a.name == "device" for a in args) and not any("Tensor" in str(a.type) for a in args)


def takes_device(fn) -> bool:
    """Whether an aten op makes a tensor from no tensor, on a device it is told (arange, full, scalar_tensor...);
    ops with tensor inputs (full_like, _to_copy) keep their input's device."""
    if isinstance(fn, torch._ops.OpOverload):
        return _is_factory(fn._schema)
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return any(_is_factory(getattr(fn, o)._schema) for o in fn.overloads())
    return False


__all__ = ["aten_target", "out_form", "takes_device"]
