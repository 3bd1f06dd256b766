"""Direct state transfer between two processes over a two-member process group, in flat buckets.

Contract: :func:`send_state` sends a small header (the structure of the state dict, with each
tensor replaced by its shape and dtype, as tagged JSON: never pickle, so a peer or anyone who reaches
the rendezvous store cannot make the receiver run code; dict keys keep their int/str type and tuples
stay tuples), then the bytes of every tensor, in order, in buckets of at most :data:`BUCKET_BYTES`
(:func:`plan_buckets`). A large tensor travels alone, cut into bucket-sized pieces, each sent *from
the tensor's own memory* (a byte view, no copy); small tensors (biases, norms, step counts) are
packed together, and only such a packed bucket is staged in a buffer. So a stayer that serves as the state source
keeps no serialised copy of its state (zero memory overhead, up to :data:`WINDOW` staged buckets).
Up to :data:`WINDOW` buckets are in flight on each side (posted together, then waited for).

:func:`recv_state` rebuilds the structure from the header. Given ``into`` (the receiver's own state
of the same structure, e.g. its runner's ``state()``), every tensor whose shape and dtype match
receives *into that tensor's memory*; the others are allocated. Each bucket lands straight in its
tensor when it lies in one, else in a staging buffer that is then scattered. The receiver's tensors
are bit-identical to the sender's. Over a gloo group CUDA tensors are staged through
the host memory of a gloo group. Over an NCCL group (``runtime.backend=nccl``) the header, the
buckets and every allocated or staged tensor live on the current CUDA device instead: state moves
device to device over NCCL point-to-point, never through host memory (:func:`wire_device`). Failures (peer died,
timeout, cancelled switch) raise CommError; so does a header that is not valid tagged JSON of the accepted types
(str/int/float/bool/None, lists, tuples, dicts, tensors of the dtypes in ``DTYPES``), or a state holding another type on
the sender.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from tmslurm.comm.fabric import wait_p2p
from tmslurm.core.errors import CommError

SIZE_TAG, HEADER_TAG, TENSOR_TAG = 1, 2, 100
DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    )
}
MAX_HEADER = 64 << 20


BUCKET_BYTES = 32 << 20
"""Bytes per message. Per-tensor messages (the first version) reached 0.6 GB/s where one large send
on the same pair ran at 3-5 GB/s: the cost was per message, not per byte."""

WINDOW = 4
"""Buckets in flight at once on each side: posted together, then waited for."""

CPU = torch.device("cpu")
"""The default device of the helpers below (a shared constant, not a call in each default)."""


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


def _join(
    obj: Any,
    tensors: list[torch.Tensor | None],
    own: dict[tuple, torch.Tensor],
    dev: torch.device,
    path: tuple = (),
    depth: int = 0,
) -> Any:
    """Rebuild the structure from tagged JSON; placeholders become entries of ``tensors``: the
    receiver's own tensor at the same ``path`` in ``own`` when it fits, else a new one."""
    if depth > 64:
        raise CommError("state transfer header nests too deep")
    if isinstance(obj, list):
        return [_join(v, tensors, own, dev, (*path, i), depth + 1) for i, v in enumerate(obj)]
    if not isinstance(obj, dict):
        return _scalar(obj)
    if set(obj) == {"d"} and isinstance(obj["d"], list):
        return {_key(kv): _join(kv[1], tensors, own, dev, (*path, kv[0]), depth + 1) for kv in obj["d"]}
    if set(obj) == {"u"} and isinstance(obj["u"], list):
        return tuple(_join(v, tensors, own, dev, (*path, i), depth + 1) for i, v in enumerate(obj["u"]))
    if set(obj) == {"t", "shape", "dtype"}:
        return _placeholder(obj, tensors, own.pop(path, None), dev)
    raise CommError(f"state transfer header has an unknown node {sorted(obj)[:5]}")


def _key(kv: Any) -> Any:
    if not (isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], (int, str)) and not isinstance(kv[0], bool)):
        raise CommError("state transfer header has a bad dict entry")
    return kv[0]


def _placeholder(
    obj: dict[str, Any], tensors: list[torch.Tensor | None], mine: torch.Tensor | None, dev: torch.device
) -> torch.Tensor:
    i, shape, dtype = obj["t"], obj["shape"], obj["dtype"]
    ok = (
        isinstance(i, int)
        and 0 <= i < len(tensors)
        and tensors[i] is None
        and dtype in DTYPES
        and isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    )
    if not ok:
        raise CommError(f"state transfer header has a bad tensor entry {obj!r:.200}")
    if mine is not None and list(mine.shape) == shape and mine.dtype == DTYPES[dtype]:
        t = mine
    else:
        t = torch.empty(shape, dtype=DTYPES[dtype], device=dev)
    tensors[i] = t
    return t


def wire_device(pg: Any) -> torch.device:
    """Where a group's messages live: the current CUDA device for an NCCL group, else the host."""
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is not None and isinstance(pg, nccl):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def own_tensors(obj: Any, path: tuple = (), device: torch.device = CPU) -> dict[tuple, torch.Tensor]:
    """The receiver's tensors that may be received into, by their path in ``obj``: contiguous tensors
    on ``device`` (the wire's) whose memory overlaps no other tensor of ``obj`` (distinct views of one buffer, such as a
    standby's arena, qualify; two tensors sharing bytes are both left out, so no two received tensors
    can land in the same memory)."""
    found: dict[tuple, torch.Tensor] = {}
    spans: list[tuple[int, int, tuple | None]] = []

    def walk(o: Any, p: tuple) -> None:
        if isinstance(o, torch.Tensor):
            usable = o.device == device and o.is_contiguous() and not o.requires_grad
            start, size = o.data_ptr(), o.numel() * o.element_size()
            if size:  # an empty tensor holds no byte another could share
                spans.append((start, start + size, p if usable else None))
            if usable:
                found[p] = o
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, (*p, k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, (*p, i))

    walk(obj, path)
    spans.sort(key=lambda s: s[0])
    reach, last = -1, None
    for start, end, p in spans:
        if start < reach:  # overlaps the span that reaches furthest so far: neither may be received into
            for q in (p, last):
                if q is not None:
                    found.pop(q, None)
        if end > reach:
            reach, last = end, p
    return found


def send_state(
    pg: Any, peer: int, state: dict[str, Any], timeout_s: float, midway: Callable[[], None] | None = None
) -> int:
    """Send ``state`` to ``peer``; returns the number of tensor bytes sent. ``midway`` (tests'
    injected faults) is called once the header is out and before any tensor: the peer is then in
    the middle of receiving."""
    tensors: list[torch.Tensor] = []
    skeleton = {"n": 0, "s": _split(state, tensors)}
    skeleton["n"] = len(tensors)
    dev = wire_device(pg)
    header = torch.frombuffer(bytearray(json.dumps(skeleton, separators=(",", ":")).encode()), dtype=torch.uint8).to(
        dev
    )
    _wait(pg.send([torch.tensor([header.numel()], dtype=torch.int64, device=dev)], peer, SIZE_TAG), timeout_s, "size")
    _wait(pg.send([header], peer, HEADER_TAG), timeout_s, "header")
    if midway is not None:
        midway()
    views = [_bytes_of(_on(t, dev)) for t in tensors]
    buckets = plan_buckets([v.numel() for v in views], BUCKET_BYTES)
    for first in range(0, len(buckets), WINDOW):
        works = [
            pg.send([_gather(views, bucket)], peer, TENSOR_TAG + i)
            for i, bucket in enumerate(buckets[first : first + WINDOW], first)
        ]
        _wait(_Batch(works), timeout_s, f"buckets {first}..{first + len(works) - 1}")
    return sum(v.numel() for v in views)


def recv_state(
    pg: Any,
    peer: int,
    timeout_s: float,
    should_stop: Callable[[], bool] | None = None,
    into: Any = None,
    midway: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """Receive a state from ``peer``: (the state, tensor bytes). ``into``: the receiver's own state
    of the same structure, whose matching tensors are received into (see the module contract).
    ``midway`` (tests' injected faults) is called once the header is in, before any tensor."""
    dev = wire_device(pg)
    size = torch.zeros(1, dtype=torch.int64, device=dev)
    _wait(pg.recv([size], peer, SIZE_TAG), timeout_s, "size", should_stop)
    if not 0 < int(size.item()) <= MAX_HEADER:
        raise CommError(f"state transfer header size {int(size.item())} is out of range")
    header = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
    _wait(pg.recv([header], peer, HEADER_TAG), timeout_s, "header", should_stop)
    if midway is not None:
        midway()
    own = own_tensors(into, device=dev) if into is not None else {}
    state, tensors = _parse_header(header.to("cpu").numpy().tobytes(), own, dev)
    views = [_bytes_of(t) for t in tensors]
    buckets = plan_buckets([v.numel() for v in views], BUCKET_BYTES)
    for first in range(0, len(buckets), WINDOW):
        window = buckets[first : first + WINDOW]
        targets = [_target(views, bucket, dev) for bucket in window]
        works = [pg.recv([target], peer, TENSOR_TAG + i) for i, target in enumerate(targets, first)]
        _wait(_Batch(works), timeout_s, f"buckets {first}..{first + len(works) - 1}", should_stop)
        for bucket, target in zip(window, targets):
            _scatter(views, bucket, target)
    return state, sum(v.numel() for v in views)


Segment = tuple[int, int, int]
"""(tensor index, byte offset in that tensor, byte count)."""


def plan_buckets(sizes: list[int], bucket_bytes: int, small_bytes: int | None = None) -> list[list[Segment]]:
    """Cut tensors of ``sizes`` bytes into buckets of at most ``bucket_bytes``, in order: a tensor of
    at least ``small_bytes`` (default: a quarter bucket) travels alone, cut into bucket-sized pieces
    (each a view of its memory, never staged); smaller ones are packed together. Each bucket is the
    list of tensor byte ranges it covers; empty tensors take no bucket."""
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be positive")
    small = max(1, bucket_bytes // 4) if small_bytes is None else small_bytes
    buckets: list[list[Segment]] = []
    packed: list[Segment] = []
    room = bucket_bytes
    for i, size in enumerate(sizes):
        if size >= small:
            if packed:
                buckets.append(packed)
                packed, room = [], bucket_bytes
            buckets.extend([(i, off, min(bucket_bytes, size - off))] for off in range(0, size, bucket_bytes))
            continue
        offset = 0
        while offset < size:
            n = min(room, size - offset)
            packed.append((i, offset, n))
            offset += n
            room -= n
            if room == 0:
                buckets.append(packed)
                packed, room = [], bucket_bytes
    if packed:
        buckets.append(packed)
    return buckets


def _on(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``t`` as it goes on the wire: itself when it is contiguous on the wire's device, else a copy there."""
    src = t.detach()
    return src if src.device == dev and src.is_contiguous() else src.contiguous().to(dev)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's memory as a flat uint8 view (no copy; ``t`` must be contiguous on the host)."""
    return t.reshape(-1).view(torch.uint8)


def _gather(views: list[torch.Tensor], bucket: list[Segment]) -> torch.Tensor:
    """What the sender posts for ``bucket``: a view when it lies inside one tensor, else a staged copy."""
    if len(bucket) == 1:
        i, off, n = bucket[0]
        return views[i][off : off + n]
    return torch.cat([views[i][off : off + n] for i, off, n in bucket])


def _target(views: list[torch.Tensor], bucket: list[Segment], dev: torch.device) -> torch.Tensor:
    """Where the receiver receives ``bucket``: straight into its tensor, or into a staging buffer."""
    if len(bucket) == 1:
        i, off, n = bucket[0]
        return views[i][off : off + n]
    return torch.empty(sum(n for _, _, n in bucket), dtype=torch.uint8, device=dev)


def _scatter(views: list[torch.Tensor], bucket: list[Segment], staged: torch.Tensor) -> None:
    if len(bucket) == 1:
        return
    at = 0
    for i, off, n in bucket:
        views[i][off : off + n].copy_(staged[at : at + n])
        at += n


def _parse_header(
    data: bytes, own: dict[tuple, torch.Tensor] | None = None, dev: torch.device = CPU
) -> tuple[Any, list[torch.Tensor]]:
    try:
        skeleton = json.loads(data)
    except (ValueError, RecursionError):
        raise CommError("state transfer header is not JSON") from None
    if not (
        isinstance(skeleton, dict)
        and set(skeleton) == {"n", "s"}
        and isinstance(skeleton["n"], int)
        and 0 <= skeleton["n"] < 1 << 20
    ):
        raise CommError("state transfer header has a bad envelope")
    tensors: list[torch.Tensor | None] = [None] * skeleton["n"]
    state = _join(skeleton["s"], tensors, dict(own or {}), dev)
    if any(t is None for t in tensors):
        raise CommError("state transfer header announces tensors it does not place")
    return state, tensors  # type: ignore[return-value]
