"""A lane: one background thread that runs Slurm commands in order, off the controller's thread.

Contract: :meth:`Lane.submit` queues ``work`` and returns at once; the lane's single daemon thread
runs the queued work in submission order (so a spare job is submitted before it is cancelled, and
node states are read before a submission that uses them). A failing ``work`` is logged with its
name and the lane goes on; nothing is raised to the submitter. Results the controller needs are
handed back by the work itself (a callback that queues an item for the controller's thread).
:meth:`Lane.flush` waits, up to a timeout, for everything queued so far (used once the controller's
loop ended, e.g. so a requeue is sent before the process exits); it returns whether the lane
drained. ``Lane(inline=True)`` runs work at once in the caller (tests that check the commands).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Lane:
    def __init__(self, name: str = "slurm-lane", inline: bool = False) -> None:
        self.name = name
        self.inline = inline
        self.items: queue.Queue[tuple[Callable[[], object], str]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        if not inline:
            self.thread.start()

    def submit(self, work: Callable[[], object], name: str) -> None:
        if self.inline:
            self._one(work, name)
        else:
            self.items.put((work, name))

    def flush(self, timeout_s: float) -> bool:
        """Wait for everything submitted so far; False when it did not finish within ``timeout_s``."""
        if self.inline:
            return True
        done = threading.Event()
        self.items.put((done.set, "flush"))
        return done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            work, name = self.items.get()
            self._one(work, name)

    @staticmethod
    def _one(work: Callable[[], object], name: str) -> None:
        try:
            work()
        except Exception:  # a Slurm helper bug must not kill the lane: later commands still run
            log.exception("background Slurm work %s failed", name)
