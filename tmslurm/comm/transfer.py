"""Direct state transfer between two processes over a two-member process group.

Contract: :func:`send_state` serialises a state dict with ``torch.save`` and sends its length and
bytes; :func:`recv_state` receives and deserialises it. The bytes are exactly the sender's tensors,
so the receiver's state is bit-identical. Failures (peer died, timeout) raise CommError.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import torch

from tmslurm.comm.fabric import wait_p2p
from tmslurm.errors import CommError


def _wait(work: Any, timeout_s: float, what: str, should_stop: Callable[[], bool] | None = None) -> None:
    try:
        wait_p2p(work, timeout_s, 0.05, should_stop or (lambda: False))
    except CommError as exc:
        raise CommError(f"state transfer ({what}) {exc}") from None


def send_state(pg: Any, peer: int, state: dict[str, Any], timeout_s: float) -> int:
    buf = io.BytesIO()
    torch.save(_to_cpu(state), buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    _wait(pg.send([torch.tensor([payload.numel()], dtype=torch.int64)], peer, 1), timeout_s, "size")
    _wait(pg.send([payload], peer, 2), timeout_s, "payload")
    return payload.numel()


def recv_state(pg: Any, peer: int, timeout_s: float, should_stop: Callable[[], bool] | None = None) -> tuple[dict[str, Any], int]:
    size = torch.zeros(1, dtype=torch.int64)
    _wait(pg.recv([size], peer, 1), timeout_s, "size", should_stop)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    _wait(pg.recv([payload], peer, 2), timeout_s, "payload", should_stop)
    state = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)
    return state, int(size.item())


def _to_cpu(obj: Any) -> Any:
    """State goes through host memory (the transfer group is gloo); the receiver moves it back."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
