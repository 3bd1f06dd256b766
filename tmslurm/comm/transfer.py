"""Direct state transfer between two processes over a two-member process group.

Contract: :func:`send_state` sends a small header (the structure of the state dict, with each
tensor replaced by its shape and dtype, serialised with ``torch.save``) and then every tensor
*directly from its own memory* — no serialised copy of the state is made on the sender, so a stayer
that serves as the state source keeps no extra copy (zero memory overhead). :func:`recv_state`
allocates each tensor from the header and receives into it. The receiver's tensors are bit-identical
to the sender's. The group is gloo (host memory); CUDA tensors are staged through the host.
Failures (peer died, timeout, cancelled switch) raise CommError.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import torch

from tmslurm.comm.fabric import wait_p2p
from tmslurm.errors import CommError

SIZE_TAG, HEADER_TAG, TENSOR_TAG = 1, 2, 100


def _wait(work: Any, timeout_s: float, what: str, should_stop: Callable[[], bool] | None = None) -> None:
    try:
        wait_p2p(work, timeout_s, 0.05, should_stop or (lambda: False))
    except CommError as exc:
        raise CommError(f"state transfer ({what}) {exc}") from None


def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """The structure of ``obj`` with every tensor replaced by a placeholder; tensors collected in order."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"__tensor__": len(tensors) - 1, "shape": list(obj.shape), "dtype": str(obj.dtype).replace("torch.", "")}
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, tensors) for v in obj)
    return obj


def _join(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict) and "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if isinstance(obj, dict):
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join(v, tensors) for v in obj)
    return obj


def _placeholders(obj: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(obj, dict) and "__tensor__" in obj:
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _placeholders(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _placeholders(v, out)


def send_state(pg: Any, peer: int, state: dict[str, Any], timeout_s: float) -> int:
    """Send ``state`` to ``peer``; returns the number of tensor bytes sent."""
    tensors: list[torch.Tensor] = []
    buf = io.BytesIO()
    torch.save(_split(state, tensors), buf)
    header = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    _wait(pg.send([torch.tensor([header.numel()], dtype=torch.int64)], peer, SIZE_TAG), timeout_s, "size")
    _wait(pg.send([header], peer, HEADER_TAG), timeout_s, "header")
    total = 0
    for i, t in enumerate(tensors):
        src = t.detach()
        src = src if src.device.type == "cpu" and src.is_contiguous() else src.contiguous().cpu()
        if src.dim() == 0:
            src = src.reshape(1)
        _wait(pg.send([src], peer, TENSOR_TAG + i), timeout_s, f"tensor {i}")
        total += src.numel() * src.element_size()
    return total


def recv_state(pg: Any, peer: int, timeout_s: float, should_stop: Callable[[], bool] | None = None) -> tuple[dict[str, Any], int]:
    size = torch.zeros(1, dtype=torch.int64)
    _wait(pg.recv([size], peer, SIZE_TAG), timeout_s, "size", should_stop)
    header = torch.empty(int(size.item()), dtype=torch.uint8)
    _wait(pg.recv([header], peer, HEADER_TAG), timeout_s, "header", should_stop)
    skeleton = torch.load(io.BytesIO(header.numpy().tobytes()), weights_only=False)
    places: list[dict[str, Any]] = []
    _placeholders(skeleton, places)
    tensors: list[torch.Tensor] = [None] * len(places)  # type: ignore[list-item]
    total = 0
    for p in sorted(places, key=lambda p: p["__tensor__"]):
        i = p["__tensor__"]
        t = torch.empty(max(1, _numel(p["shape"])) if not p["shape"] else p["shape"], dtype=getattr(torch, p["dtype"]))
        _wait(pg.recv([t], peer, TENSOR_TAG + i), timeout_s, f"tensor {i}", should_stop)
        tensors[i] = t.reshape(()) if not p["shape"] else t
        total += t.numel() * t.element_size()
    return _join(skeleton, tensors), total


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
