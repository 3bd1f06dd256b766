"""The controller's snapshot: its last committed step, kept on disk without blocking the loop.

Contract: :meth:`Snapshots.offer` (on the controller's thread) hands over the latest state after a
commit and returns at once; a writer thread writes only the newest one it has (older offers it
has not reached are skipped) to ``snapshot.json`` atomically (a temporary file, then
``os.replace``), so a reader sees a whole snapshot or the previous one, never a torn file. What it
holds: ``step`` (steps committed so far), ``epoch``, ``epochs`` (the highest epoch handed out),
``last_commit_t``, ``t``, ``fired`` (injected faults already fired), ``standbys_started``,
``incarnation`` (of the ranks' processes, raised by each checkpoint restart). With a
``steps_path``, the step log entries handed to :meth:`offer` are appended there (one JSON line
each, before the snapshot that counts them), so a restarted controller has the whole step log. It
is what the next incarnation of a requeued job compares with the
checkpoint it resumes from (the steps to redo) when the controller could not say so itself; as it
is written off the loop, a host that dies right after a commit may leave the one before on disk
(a reader takes the most of it and the step log, which is appended first). A write that fails is logged and retried with
the next offer; :meth:`close` writes the last one. :func:`read_steps` reads the step log back (a torn last line, from a
controller killed mid-append, is skipped).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tmslurm.core.jsonfile import write_json_atomic

log = logging.getLogger(__name__)


class Snapshots:
    def __init__(self, path: Path, steps_path: Path | None = None) -> None:
        self.path = path
        self.steps_path = steps_path
        self.cond = threading.Condition()
        self.pending: dict[str, Any] | None = None
        self.entries: list[dict[str, Any]] = []
        self.closed = False
        self.last_step: int | None = None
        self.thread = threading.Thread(target=self._write_loop, name="snapshot", daemon=True)
        self.thread.start()

    def offer(self, step: int, snapshot: dict[str, Any], entries: Sequence[dict[str, Any]] = ()) -> None:
        """The state after a commit and the step log entries new since the last offer; only a new ``step`` is queued."""
        if step == self.last_step:
            return
        self.last_step = step
        with self.cond:
            self.pending = {"step": step, **snapshot}
            self.entries.extend(entries)
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
                entries, self.entries = self.entries, []
                closed = self.closed
            if entries and self.steps_path is not None:
                self._append(self.steps_path, entries)
            if item is not None:
                self._write(item)
            if closed:
                return

    def _write(self, item: dict[str, Any]) -> None:
        try:
            write_json_atomic(self.path, item)
        except OSError as exc:
            log.error("cannot write %s: %s", self.path, exc)

    def _append(self, path: Path, entries: list[dict[str, Any]]) -> None:
        try:
            with open(path, "a") as f:
                f.write("".join(json.dumps(e, default=str) + "\n" for e in entries))
        except OSError as exc:
            log.error("cannot append to %s: %s", path, exc)


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The step log appended at ``path`` (empty when there is none); unreadable lines are skipped."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("step"), int):
            out.append(entry)
    return out


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
