"""Direct state transfer between two processes over a two-member process group.

Contract: :func:`send_state` sends a small header (the structure of the state dict, with each
tensor replaced by its shape and dtype, as tagged JSON: never pickle, so a peer or anyone who reaches
the rendezvous store cannot make the receiver run code; dict keys keep their int/str type and tuples
stay tuples) and then every tensor
*directly from its own memory* — no serialised copy of the state is made on the sender, so a stayer
that serves as the state source keeps no extra copy (zero memory overhead). :func:`recv_state`
allocates each tensor from the header and receives into it. Up to :data:`WINDOW` tensor messages
are in flight at once on each side (posted together, then waited for), so the transfer is not one
round trip per tensor. The receiver's tensors are bit-identical
to the sender's. The group is gloo (host memory); CUDA tensors are staged through the host.
Failures (peer died, timeout, cancelled switch) raise CommError; so does a header that is not valid
tagged JSON of the accepted types (str/int/float/bool/None, lists, tuples, dicts, tensors of the
dtypes in ``DTYPES``), or a state holding another type on the sender.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import torch

from tmslurm.comm.fabric import wait_p2p
from tmslurm.errors import CommError

SIZE_TAG, HEADER_TAG, TENSOR_TAG = 1, 2, 100
DTYPES = {name: getattr(torch, name) for name in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
                                                  "int8", "uint8", "bool", "complex64", "complex128")}
MAX_HEADER = 64 << 20


WINDOW = 64
"""Tensor messages in flight at once: posted together, then waited for. One at a time, each tensor
cost a round trip between the two processes (a 400 KB state of 30-odd tensors took ~90 ms on
loopback with training running next to it; docs/benchmarks.md section 2)."""


class _Batch:
    """Several posted sends or receives, waited for in order by one helper thread."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


def _wait(work: Any, timeout_s: float, what: str, should_stop: Callable[[], bool] | None = None) -> None:
    try:
        wait_p2p(work, timeout_s, 0.05, should_stop or (lambda: False))
    except CommError as exc:
        raise CommError(f"state transfer ({what}) {exc}") from None


def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Tagged-JSON structure of ``obj``: every tensor a placeholder (collected in order), dicts as
    key/value pairs (keys keep their type), tuples tagged."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"t": len(tensors) - 1, "shape": list(obj.shape), "dtype": str(obj.dtype).replace("torch.", "")}
    if isinstance(obj, dict):
        return {"d": [[_scalar(k), _split(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"u": [_split(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_split(v, tensors) for v in obj]
    return _scalar(obj)


def _scalar(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CommError(f"state transfer cannot send a {type(obj).__name__} (only tensors, numbers, strings, lists, dicts)")


def _join(obj: Any, tensors: list[torch.Tensor | None], depth: int = 0) -> Any:
    """Rebuild the structure from tagged JSON; placeholders become entries of ``tensors``."""
    if depth > 64:
        raise CommError("state transfer header nests too deep")
    if isinstance(obj, list):
        return [_join(v, tensors, depth + 1) for v in obj]
    if not isinstance(obj, dict):
        return _scalar(obj)
    if set(obj) == {"d"} and isinstance(obj["d"], list):
        return {_key(kv): _join(kv[1], tensors, depth + 1) for kv in obj["d"]}
    if set(obj) == {"u"} and isinstance(obj["u"], list):
        return tuple(_join(v, tensors, depth + 1) for v in obj["u"])
    if set(obj) == {"t", "shape", "dtype"}:
        return _placeholder(obj, tensors)
    raise CommError(f"state transfer header has an unknown node {sorted(obj)[:5]}")


def _key(kv: Any) -> Any:
    if not (isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], (int, str)) and not isinstance(kv[0], bool)):
        raise CommError("state transfer header has a bad dict entry")
    return kv[0]


def _placeholder(obj: dict[str, Any], tensors: list[torch.Tensor | None]) -> torch.Tensor:
    i, shape, dtype = obj["t"], obj["shape"], obj["dtype"]
    ok = (isinstance(i, int) and 0 <= i < len(tensors) and tensors[i] is None and dtype in DTYPES and isinstance(shape, list)
          and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape))
    if not ok:
        raise CommError(f"state transfer header has a bad tensor entry {obj!r:.200}")
    t = torch.empty(shape, dtype=DTYPES[dtype])
    tensors[i] = t
    return t


def send_state(pg: Any, peer: int, state: dict[str, Any], timeout_s: float) -> int:
    """Send ``state`` to ``peer``; returns the number of tensor bytes sent."""
    tensors: list[torch.Tensor] = []
    skeleton = {"n": 0, "s": _split(state, tensors)}
    skeleton["n"] = len(tensors)
    header = torch.frombuffer(bytearray(json.dumps(skeleton, separators=(",", ":")).encode()), dtype=torch.uint8)
    _wait(pg.send([torch.tensor([header.numel()], dtype=torch.int64)], peer, SIZE_TAG), timeout_s, "size")
    _wait(pg.send([header], peer, HEADER_TAG), timeout_s, "header")
    total = 0
    for first in range(0, len(tensors), WINDOW):
        works = []
        for i, t in enumerate(tensors[first:first + WINDOW], first):
            src = t.detach()
            src = src if src.device.type == "cpu" and src.is_contiguous() else src.contiguous().cpu()
            if src.dim() == 0:
                src = src.reshape(1)
            works.append(pg.send([src], peer, TENSOR_TAG + i))
            total += src.numel() * src.element_size()
        _wait(_Batch(works), timeout_s, f"tensors {first}..{first + len(works) - 1}")
    return total


def recv_state(pg: Any, peer: int, timeout_s: float, should_stop: Callable[[], bool] | None = None) -> tuple[dict[str, Any], int]:
    size = torch.zeros(1, dtype=torch.int64)
    _wait(pg.recv([size], peer, SIZE_TAG), timeout_s, "size", should_stop)
    if not 0 < int(size.item()) <= MAX_HEADER:
        raise CommError(f"state transfer header size {int(size.item())} is out of range")
    header = torch.empty(int(size.item()), dtype=torch.uint8)
    _wait(pg.recv([header], peer, HEADER_TAG), timeout_s, "header", should_stop)
    state, tensors = _parse_header(header.numpy().tobytes())
    total = 0
    for first in range(0, len(tensors), WINDOW):
        works = []
        for i, t in enumerate(tensors[first:first + WINDOW], first):
            works.append(pg.recv([t.reshape(1) if t.dim() == 0 else t], peer, TENSOR_TAG + i))
            total += t.numel() * t.element_size()
        _wait(_Batch(works), timeout_s, f"tensors {first}..{first + len(works) - 1}", should_stop)
    return state, total


def _parse_header(data: bytes) -> tuple[Any, list[torch.Tensor]]:
    try:
        skeleton = json.loads(data)
    except (ValueError, RecursionError):
        raise CommError("state transfer header is not JSON") from None
    if not (isinstance(skeleton, dict) and set(skeleton) == {"n", "s"} and isinstance(skeleton["n"], int) and 0 <= skeleton["n"] < 1 << 20):
        raise CommError("state transfer header has a bad envelope")
    tensors: list[torch.Tensor | None] = [None] * skeleton["n"]
    state = _join(skeleton["s"], tensors)
    if any(t is None for t in tensors):
        raise CommError("state transfer header announces tensors it does not place")
    return state, tensors  # type: ignore[return-value]
