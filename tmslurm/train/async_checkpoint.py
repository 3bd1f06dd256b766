"""Asynchronous checkpoints of one pipeline stage: snapshot at the step boundary, write in the background.

Contract: :meth:`AsyncCheckpointer.save` first waits for the previous save of this worker (at most one
is in flight; a wait is logged at INFO with its duration), then takes a :func:`~tmslurm.train.checkpoint.snapshot`
(private CPU copies: the step's only stall) and hands it to ``torch.distributed.checkpoint.async_save``
with ``no_dist=True``. When the DCP files are written, ``meta.json`` (the completeness marker, with
both digests computed from the snapshot) is written by the same background thread, so
:func:`~tmslurm.train.checkpoint.latest_complete` never sees a half-written shard. :meth:`wait`
blocks until the in-flight save is complete (callers use it before the process exits and before a
checkpoint the controller waits for). The files are exactly those of the synchronous
:func:`~tmslurm.train.checkpoint.save_stage`.

Why ``async_save``: in torch 2.13 it works without a process group (``no_dist=True``) and runs the
plain ``dcp.save`` in a one-thread executor. Its default stager would copy the state a second time,
so a pass-through stager hands it our snapshot (already a private CPU copy, which we need anyway to
compute the digests off the step thread). The process-based executor (``AsyncCheckpointerType.PROCESS``)
would not compete for the GIL but needs the default process group, which tmslurm never creates, so
the writer is a thread: its per-tensor serialisation is mostly Python and slows the steps it overlaps
on a CPU-bound rank (docs/benchmarks.md, "Checkpoint stall"). ``Future.result()`` returns before done-callbacks run and
``concurrent.futures`` swallows callback exceptions, so the callback catches everything itself and
completion is signalled by an ``Event`` set last.

Failure: an error of the background write (or of ``meta.json``) is logged at ERROR with the step and
shard (run and rank come from the log context) and raised as
:class:`~tmslurm.core.errors.CheckpointError` by the next :meth:`wait` or :meth:`save`; the failed shard
has no ``meta.json``, so it is never resumed from.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager

from tmslurm.core.errors import CheckpointError
from tmslurm.train import checkpoint
from tmslurm.train.checkpoint import Snapshot
from tmslurm.train.schedule import StageRunner

log = logging.getLogger(__name__)


class _AlreadyStaged(AsyncStager):
    """The state dict is already a private CPU snapshot: stage it as it is."""

    _synchronize_after_execute = False

    def stage(self, state_dict: dict) -> dict:
        return state_dict

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


class _InFlight:
    """One background save: the DCP upload, then ``meta.json``; ``done`` is set when both are over.

    The snapshot is dropped once written, so between checkpoints no CPU copy is kept alive."""

    def __init__(self, path: Path, snap: Snapshot) -> None:
        self.path = path
        self.step = snap.step
        self.shard = snap.shard
        self.snap: Snapshot | None = snap
        self.done = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        assert self.snap is not None
        try:
            future = dcp.async_save(
                self.snap.state, checkpoint_id=str(self.path), no_dist=True, async_stager=_AlreadyStaged()
            )
        except (Exception, CheckpointException) as exc:  # CheckpointException derives from BaseException
            self._fail(exc)
            return
        # an AsyncSaveResponse comes back only from a stager whose stage() returns a Future
        assert isinstance(future, Future)
        future.add_done_callback(self._finish)

    def _finish(self, future: Future) -> None:
        try:
            future.result()
            assert self.snap is not None
            checkpoint.write_meta(self.path, self.snap)
            log.info("checkpoint step=%d %s saved to %s (in the background)", self.step, self.shard, self.path)
        except (Exception, CheckpointException) as exc:
            self._fail(exc)
        finally:
            self.snap = None
            self.done.set()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self.snap = None
        log.error("background checkpoint step=%d %s to %s failed: %s", self.step, self.shard, self.path, describe(exc))
        self.done.set()


def describe(exc: BaseException) -> str:
    """``Type: message`` of the root cause (DCP wraps writer errors in a CheckpointException with a traceback)."""
    if isinstance(exc, CheckpointException) and exc.failures:
        return "; ".join(f"{type(e).__name__}: {str(e)[:300]}" for e, _trace in exc.failures.values())
    return f"{type(exc).__name__}: {str(exc)[:500]}"


class AsyncCheckpointer:
    """At most one checkpoint of this worker in flight; see the module docstring."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.pending: _InFlight | None = None

    def save(self, step: int, stage: int | str, runner: StageRunner) -> Path:
        """Snapshot now and write in the background; waits first for the previous save (logged)."""
        busy_step = self.pending.step if self.pending is not None and self.in_flight else None
        waited = self.wait()
        if busy_step is not None:
            log.info(
                "checkpoint step=%d waited %.3f s for the previous save (step %d) to finish", step, waited, busy_step
            )
        snap = checkpoint.snapshot(runner, step, stage)
        self.pending = _InFlight(checkpoint.shard_path(self.run_dir, snap), snap)
        self.pending.start()
        return self.pending.path

    def wait(self) -> float:
        """Block until the in-flight save is complete; its error, if any, as CheckpointError. Returns seconds waited."""
        pending, self.pending = self.pending, None
        if pending is None:
            return 0.0
        t0 = time.monotonic()
        pending.done.wait()
        if pending.error is not None:
            exc = pending.error
            raise CheckpointError(
                f"background checkpoint step={pending.step} {pending.shard} to {pending.path} failed: {describe(exc)}"
            ) from exc
        return time.monotonic() - t0

    @property
    def in_flight(self) -> bool:
        return self.pending is not None and not self.pending.done.is_set()
