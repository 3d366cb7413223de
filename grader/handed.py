"""What the student's process hands back to the judge's (grader/harness.py): the values a
check's student half returns, as JSON, and back. Tensors keep their dtype, shape, device
(a meta tensor travels without values) and requires_grad; numbers, strings, None, lists
and dicts of strings travel as they are. Anything else is refused; nothing is unpickled.
"""

import base64

import numpy as np
import torch


def encode(x):
    """A value the student's code handed back, as JSON: tensors (any dtype, shape and
    device; a meta tensor without values), numbers, strings, None, lists and dicts."""
    if isinstance(x, np.ndarray | np.generic):
        x = torch.as_tensor(x) if isinstance(x, np.ndarray) else x.item()
    if torch.is_tensor(x):
        t = x.detach()
        head = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        head |= {"device": t.device.type, "grad": x.requires_grad}
        if t.device.type != "meta":
            raw = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            head["data"] = base64.b64encode(raw).decode()
        return {"tensor": head}
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if isinstance(x, list | tuple | torch.Size):
        return [encode(v) for v in x]
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {"dict": {k: encode(v) for k, v in x.items()}}
    raise TypeError(f"handed back a {type(x).__name__}: tensors or numbers were expected")


DTYPES = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}


def decode(x):
    """encode's value back: tensors built from their bytes (a meta tensor empty)."""
    if isinstance(x, list):
        return [decode(v) for v in x]
    if isinstance(x, dict) and "dict" in x:
        return {k: decode(v) for k, v in x["dict"].items()}
    if isinstance(x, dict) and "tensor" in x:
        head = x["tensor"]
        dtype, shape = DTYPES.get(head["dtype"]), head["shape"]
        if dtype is None:
            raise ValueError(f"a tensor of dtype {head['dtype']}")
        if "data" not in head:
            return torch.empty(shape, dtype=dtype, device="meta")
        raw = bytearray(base64.b64decode(head["data"]))
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
        t = t.view(dtype).reshape(shape)
        return t.requires_grad_() if head["grad"] and t.is_floating_point() else t
    return x
