"""The controller's snapshot: its last committed step, kept on disk without blocking the loop.

Contract: :meth:`Snapshots.offer` (on the controller's thread) hands over the latest state after a
commit and returns at once; a writer thread writes only the newest one it has (older offers it
has not reached are skipped) to ``snapshot.json`` atomically (a temporary file, then
``os.replace``), so a reader sees a whole snapshot or the previous one, never a torn file. What it
holds: ``step`` (steps committed so far), ``epoch``, ``last_commit_t``, ``t``, ``fired`` (injected
faults already fired). It is what the next incarnation of a requeued job compares with the
checkpoint it resumes from (the steps to redo) when the controller could not say so itself; as it
is written off the loop, a host that dies right after a commit may leave the one before on disk
(the steps redone are then under-counted by one). A write that fails is logged and retried with the
next offer; :meth:`close` writes the last one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Snapshots:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.cond = threading.Condition()
        self.pending: dict[str, Any] | None = None
        self.closed = False
        self.last_step: int | None = None
        self.thread = threading.Thread(target=self._write_loop, name="snapshot", daemon=True)
        self.thread.start()

    def offer(self, step: int, snapshot: dict[str, Any]) -> None:
        """The state after a commit; only a new ``step`` is queued."""
        if step == self.last_step:
            return
        self.last_step = step
        with self.cond:
            self.pending = {"step": step, **snapshot}
            self.cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(timeout)

    def _write_loop(self) -> None:
        while True:
            with self.cond:
                while self.pending is None and not self.closed:
                    self.cond.wait()
                item, self.pending = self.pending, None
                closed = self.closed
            if item is not None:
                self._write(item)
            if closed:
                return

    def _write(self, item: dict[str, Any]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(item))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot write %s: %s", self.path, exc)


def read_snapshot(path: Path) -> dict[str, Any] | None:
    """The snapshot at ``path``, or None when there is none or it is unreadable (logged)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring an unreadable %s: %s", path, exc)
        return None
    return data if isinstance(data, dict) and isinstance(data.get("step"), int) else None
