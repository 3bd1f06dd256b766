"""Append-only event journal of a run (``<run_dir>/events.jsonl``).

Contract: :meth:`Journal.write` appends one JSON object per line with ``t`` (epoch seconds) and
``type``, flushed at once, under a lock, then hands the entry to its listener if it has one (the
run's metrics). Lines are never rewritten. Write errors are logged, never raised: losing a journal
line must not take the run down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Journal:
    def __init__(self, path: Path, listener: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.listener = listener
        """Called with every entry after it was written (the run's metrics), on the writer's thread."""

    def write(self, entry_type: str, /, **fields: Any) -> dict[str, Any]:
        entry = {"t": time.time(), "type": entry_type, **fields}
        try:
            with self._lock, open(self.path, "a") as f:
                f.write(json.dumps(entry, default=str) + "\n")
        except OSError as exc:
            log.error("cannot append to %s: %s", self.path, exc)
        if self.listener is not None:
            self.listener(entry)
        return entry


def read_journal(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def journalled(entries: list[dict[str, Any]], types: tuple[str, ...] | None, key: str) -> list[int]:
    """The integer ``key`` of every entry of one of ``types`` (None: of any type); entries without one are skipped."""
    return [int(e[key]) for e in entries if (types is None or e.get("type") in types) and isinstance(e.get(key), int)]
