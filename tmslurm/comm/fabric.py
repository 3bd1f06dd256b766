"""The fabric: one rank's named process groups, each buildable for a new generation on its own.

Contract:
- Every group is a torch.distributed ProcessGroup (gloo on CPU, NCCL on CUDA) built directly over
  ``PrefixStore("<name>/g<generation>", store)``. There is no global ``init_process_group`` and no
  world group. Group members are logical ranks (slots); a replacement process takes its slot's
  group rank, so reduction order, and therefore every bit of the result, is unchanged.
- :meth:`Fabric.build` constructs the given generations without touching installed groups (phase 1,
  may run in a background thread while other groups carry traffic); :meth:`Fabric.install` swaps the
  handles in (phase 2). Groups not named keep their exact ProcessGroup objects.
- Every operation is issued asynchronously and waited on in short slices. Between slices the abort
  event is checked: when set, the wait raises :class:`~tmslurm.core.errors.CommAborted`. A dead peer
  surfaces as :class:`~tmslurm.core.errors.CommError` (gloo reports a closed connection within ms); no
  operation waits past ``timeout`` in total. Abandoned groups are kept in a graveyard, never
  destroyed, because destroying a group with a pending operation can block.
- Per-step op counters per group (sent, received, collectives, pending) tell the controller which
  groups an aborted step left *dirty* (entered by some members only).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tmslurm.core.errors import CommAborted, CommError
from tmslurm.core.topology import GroupSpec, Layout

log = logging.getLogger(__name__)


@dataclass
class GroupHandle:
    name: str
    generation: int
    members: tuple[int, ...]
    group_rank: int
    pg: Any

    def peer(self, rank: int) -> int:
        return self.members.index(rank)


@dataclass
class OpCount:
    sent: int = 0
    recv: int = 0
    coll: int = 0
    pending: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"sent": self.sent, "recv": self.recv, "coll": self.coll, "pending": self.pending}


@dataclass
class FabricSettings:
    backend: str = "gloo"
    timeout_s: float = 60.0
    wait_slice_s: float = 0.05
    connect_timeout_s: float = 120.0
    bind_addr: str | None = None
    """Local address gloo binds to and advertises (None: gloo's default, this host's name)."""


def gloo_device(s: FabricSettings) -> Any:
    import os

    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return dist.ProcessGroupGloo.create_device(interface=os.environ["GLOO_SOCKET_IFNAME"].split(",")[0])
    if s.bind_addr:
        return dist.ProcessGroupGloo.create_device(hostname=s.bind_addr)
    return dist.ProcessGroupGloo.create_default_device()


StoreFactory = Callable[[], Any]


def make_pg(store: Any, name: str, generation: int, group_rank: int, size: int, s: FabricSettings) -> Any:
    """Construct one ProcessGroup over a namespaced store; blocks until every member arrived."""
    prefixed = dist.PrefixStore(f"{name}/g{generation}", store)
    timeout = datetime.timedelta(seconds=s.timeout_s)
    if s.backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, group_rank, size, opts)
    # torch's stubs (torch/_C/_distributed_c10d.pyi) leave out the private _Options that Python code uses
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = timeout
    opts._devices = [gloo_device(s)]
    return dist.ProcessGroupGloo(prefixed, group_rank, size, opts)


THREAD_WAITED = ("send", "recv", "reduce_scatter")
"""Ops waited for in a helper thread (:func:`wait_p2p`): gloo closes the pair when a point-to-point wait
times out, and a gloo reduce-scatter's ``wait(timeout)`` ignores its timeout (it blocks until the
collective ends: measured on torch 2.13), so neither can be waited on in slices that check for an abort."""


class Fabric:
    def __init__(
        self,
        rank: int,
        layout: Layout,
        store_factory: StoreFactory,
        settings: FabricSettings,
        abort_event: threading.Event,
    ) -> None:
        self.rank = rank
        self.layout = layout
        self.store_factory = store_factory
        self.s = settings
        self.abort_event = abort_event
        self.handles: dict[str, GroupHandle] = {}
        self.graveyard: list[Any] = []
        self.counts: dict[str, OpCount] = {}
        self._pending_sends: list[tuple[str, Any]] = []
        self._slice = datetime.timedelta(seconds=settings.wait_slice_s)
        self.wait_s = 0.0
        """Seconds this step spent waiting for communication (since :meth:`begin_step`)."""

    # ---- building and switching -------------------------------------------------------------
    def my_groups(self) -> list[GroupSpec]:
        """Groups of this rank that need a ProcessGroup (single-member groups need none)."""
        return [g for g in self.layout.groups_of(self.rank) if len(g.members) > 1]

    def build(
        self, generations: dict[str, int], pairs: dict[str, tuple[int, int]] | None = None
    ) -> dict[str, GroupHandle]:
        """Build the named groups at the given generations (blocking); installs nothing.

        ``pairs`` adds two-member transfer groups ``{name: (generation, my_index)}``. All groups are
        built in one global name order (dp/ < pp/ < xfer/), so processes building overlapping sets
        can never wait on each other in a cycle.
        """
        store = self.store_factory()
        pairs = pairs or {}
        built = {}
        for name in sorted(set(generations) | set(pairs)):
            if name in pairs:  # state transfer: on the training backend (NCCL: device to device)
                gen, index = pairs[name]
                pg = make_pg(store, name, gen, index, 2, self.s)
                built[name] = GroupHandle(name, gen, (0, 1), index, pg)
                continue
            spec = self.layout.groups[name]
            gr = spec.group_rank(self.rank)
            pg = make_pg(store, name, generations[name], gr, len(spec.members), self.s)
            built[name] = GroupHandle(name, generations[name], spec.members, gr, pg)
        return built

    def build_in_background(
        self,
        generations: dict[str, int],
        pairs: dict[str, tuple[int, int]] | None = None,
        on_done: Callable[[BackgroundBuild], None] | None = None,
    ) -> BackgroundBuild:
        return BackgroundBuild(self, generations, pairs or {}, on_done)

    def install(self, handles: dict[str, GroupHandle]) -> None:
        """Phase 2: swap in new handles; replaced ones go to the graveyard."""
        for name, handle in handles.items():
            old = self.handles.get(name)
            if old is not None:
                self.graveyard.append(old.pg)
            self.handles[name] = handle
            self.counts[name] = OpCount()

    def abandon(self, names: list[str]) -> None:
        for name in names:
            old = self.handles.pop(name, None)
            if old is not None:
                self.graveyard.append(old.pg)

    def generations(self) -> dict[str, int]:
        return {name: h.generation for name, h in self.handles.items()}

    # ---- operations ---------------------------------------------------------------------------
    def begin_step(self) -> None:
        self.counts = {name: OpCount() for name in self.handles}
        self._pending_sends = []
        self.wait_s = 0.0

    def status(self) -> dict[str, dict[str, int]]:
        """Per installed group: this step's op counts and the group's generation."""
        return {
            name: {**self.counts.get(name, OpCount()).as_dict(), "gen": h.generation}
            for name, h in self.handles.items()
        }

    def send(self, name: str, tensor: torch.Tensor, peer: int, tag: int) -> None:
        h = self._handle(name)
        work = self._issue(name, "send", lambda: h.pg.send([tensor], h.peer(peer), tag))
        self.counts[name].sent += 1
        self._pending_sends.append((name, work))

    def recv(self, name: str, tensor: torch.Tensor, peer: int, tag: int) -> torch.Tensor:
        h = self._handle(name)
        work = self._issue(name, "recv", lambda: h.pg.recv([tensor], h.peer(peer), tag))
        self.counts[name].recv += 1
        self._wait(name, work, "recv")
        return tensor

    def allreduce(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        h = self._handle(name)
        work = self._issue(name, "allreduce", lambda: h.pg.allreduce([tensor]))
        self.counts[name].coll += 1
        self._wait(name, work, "allreduce")
        return tensor

    def reduce_scatter(self, name: str, flat: torch.Tensor) -> torch.Tensor:
        """SUM-reduce ``flat`` (length divisible by the group size) over the group; returns this member's
        chunk (group rank i gets elements [i*n/size, (i+1)*n/size))."""
        h = self._handle(name)
        size = len(h.members)
        out = torch.empty(flat.numel() // size, dtype=flat.dtype, device=flat.device)
        work = self._issue(name, "reduce_scatter", lambda: h.pg.reduce_scatter([out], [list(flat.chunk(size))]))
        self.counts[name].coll += 1
        self._wait(name, work, "reduce_scatter")
        return out

    def all_gather(self, name: str, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        """Fill ``flat`` in place: chunk i (of group-size equal chunks) from group rank i; this member's
        own chunk must already hold its values. Chunk ``skip`` is received into a scratch buffer and
        dropped, so ``flat``'s region there is left to its owner (another thread may be writing it)."""
        h = self._handle(name)
        chunks = list(flat.chunk(len(h.members)))
        mine = chunks[h.group_rank].clone()
        if skip is not None:
            chunks[skip] = torch.empty_like(chunks[skip])
        work = self._issue(name, "all_gather", lambda: h.pg.allgather([chunks], [mine]))
        self.counts[name].coll += 1
        self._wait(name, work, "all_gather")
        return flat

    def flush_sends(self) -> None:
        pending, self._pending_sends = self._pending_sends, []
        for name, work in pending:
            self._wait(name, work, "send")

    def check_abort(self) -> None:
        """Raise CommAborted once the controller said ``abort``: the step loop's stop between layers."""
        if self.abort_event.is_set():
            raise CommAborted("step abandoned between layers: the step is being aborted")

    def _handle(self, name: str) -> GroupHandle:
        try:
            return self.handles[name]
        except KeyError:
            raise CommError(f"rank {self.rank} has no group {name!r}; installed: {sorted(self.handles)}") from None

    def _issue(self, name: str, op: str, fn: Callable[[], Any]) -> Any:
        if self.abort_event.is_set():
            raise CommAborted(f"{op} on {name} not issued: the step is being aborted")
        self.counts.setdefault(name, OpCount()).pending += 1
        try:
            return fn()
        except RuntimeError as exc:
            raise CommError(f"{op} on group {name} failed to start: {_short(exc)}") from None

    def _wait(self, name: str, work: Any, op: str) -> None:
        t0 = time.perf_counter()
        try:
            self._wait_for(name, work, op)
        finally:
            self.wait_s += time.perf_counter() - t0

    def _wait_for(self, name: str, work: Any, op: str) -> None:
        if op in THREAD_WAITED:
            return self._wait_p2p(name, work, op)
        deadline = time.monotonic() + self.s.timeout_s
        while True:
            try:
                work.wait(self._slice)
                self.counts[name].pending -= 1
                return
            except RuntimeError as exc:
                if "timed out" not in str(exc).lower():
                    raise CommError(f"{op} on group {name} failed: {_short(exc)}") from None
            if self.abort_event.is_set():
                raise CommAborted(f"{op} on group {name} abandoned: the step is being aborted")
            if time.monotonic() > deadline:
                raise CommError(
                    f"{op} on group {name} timed out after {self.s.timeout_s:.0f}s (runtime.collective_timeout_s)"
                )

    def _wait_p2p(self, name: str, work: Any, op: str) -> None:
        def stop() -> bool:
            if self.abort_event.is_set():
                raise CommAborted(f"{op} on group {name} abandoned: the step is being aborted")
            return False

        try:
            wait_p2p(work, self.s.timeout_s, self.s.wait_slice_s, stop)
        except CommAborted:
            raise
        except CommError as exc:
            raise CommError(f"{op} on group {name} {exc}") from None
        self.counts[name].pending -= 1


def wait_p2p(work: Any, timeout_s: float, slice_s: float, should_stop: Callable[[], bool]) -> None:
    """Wait for a send/recv in a helper thread; raise CommError on failure, timeout or stop.

    gloo closes the pair when a point-to-point wait times out ("Application timeout caused pair
    closure"), so p2p work cannot be waited on in slices like collectives; a daemon thread waits
    with the group's own timeout while the caller's thread checks ``should_stop`` every slice. An
    abandoned waiter ends when its group (kept in a graveyard) fails or times out.
    """
    done = threading.Event()
    box: list[BaseException] = []

    def waiter() -> None:
        try:
            work.wait()
        except BaseException as exc:  # handed to the waiting thread
            box.append(exc)
        done.set()

    threading.Thread(target=waiter, name="wait-p2p", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(slice_s):
        if should_stop():
            raise CommError("abandoned: the switch was cancelled")
        if time.monotonic() > deadline:
            raise CommError(f"timed out after {timeout_s:.0f}s (runtime.collective_timeout_s)")
    if box:
        raise CommError(f"failed: {_short(box[0])}")


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) < 300 else text[:300] + "..."


@dataclass
class BackgroundBuild:
    """Phase 1 in a thread: build groups while training continues on the installed ones."""

    fabric: Fabric
    generations: dict[str, int]
    pairs: dict[str, tuple[int, int]] = field(default_factory=dict)
    on_done: Callable[[BackgroundBuild], None] | None = None
    result: dict[str, GroupHandle] = field(default_factory=dict)
    error: BaseException | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="phase1-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self.result = self.fabric.build(self.generations, self.pairs)
        except BaseException as exc:  # reported to the caller through join()
            self.error = exc
        self.seconds = time.monotonic() - t0
        if self.on_done is not None:
            self.on_done(self)

    def names(self) -> list[str]:
        return sorted(set(self.generations) | set(self.pairs))

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> dict[str, GroupHandle]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise CommError(f"group build of {self.names()} did not finish in {timeout}s")
        if self.error is not None:
            raise CommError(f"group build of {self.names()} failed: {_short(self.error)}")
        return self.result
