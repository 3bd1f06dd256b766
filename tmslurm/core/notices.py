"""Notices: "this node (or rank) is leaving", the one event type every detector hands the controller.

Contract:
- A :class:`Notice` is immutable and validated when built: ``kind`` is ``"maintenance"`` (planned:
  drain, reboot, maintenance reservation, admin notice -- migrate before ``deadline``) or
  ``"failure"`` (unexpected: the node or rank is gone or going now). It names a ``node``, a
  ``rank`` or both. ``deadline`` is epoch seconds or None ("as soon as possible").
- ``to_json()`` / ``from_json()`` round-trip exactly. ``from_json`` also accepts a deadline in any
  form :func:`parse_deadline` takes (handy for the admin hook) and defaults ``time`` to now.
- Every invalid value raises :class:`~tmslurm.core.errors.NoticeError` naming the field and listing the
  valid values or forms; nothing else is raised for bad input.
"""

from __future__ import annotations

import json
import math
import re
import time as _time
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from tmslurm.core.errors import NoticeError

KINDS = ("maintenance", "failure")
SOURCES = ("slurm", "admin", "worker", "fault", "controller")
ROLES = ("", "main", "spare")
DEADLINE_FORMS = (
    "ISO-8601 local or with offset (2026-12-02T12:00:00, 2026-12-02T12:00:00+01:00)",
    "'now'",
    "relative '+90s', '+5m', '+1h'",
    "epoch seconds (1796212800)",
)
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, kw_only=True)
class Notice:
    """A node or rank that must leave the run: planned (``maintenance``) or not (``failure``)."""

    kind: str
    """``"maintenance"`` or ``"failure"``."""
    node: str | None = None
    """Slurm node name, when known."""
    rank: int | None = None
    """Training rank, when known (a worker report or a fault injection names a rank)."""
    source: str
    """Who noticed: ``slurm`` (watcher), ``admin`` (hook), ``worker``, ``fault`` (injected), ``controller``."""
    reason: str = ""
    """Free text for people: Slurm's reason, the admin's message, the error seen."""
    deadline: float | None = None
    """Epoch seconds by which the node must be free; None = as soon as possible."""
    slurm_state: str = ""
    """Slurm's full node state when the notice came from Slurm, e.g. ``MIXED+DRAIN``; else ""."""
    time: float
    """Epoch seconds when the event was observed."""
    role: str = ""
    """For Slurm notices: ``main`` (a node of the training job) or ``spare``; "" when n/a."""

    def __post_init__(self) -> None:
        _check_choice("kind", self.kind, KINDS)
        _check_choice("source", self.source, SOURCES)
        _check_choice("role", self.role, ROLES)
        if self.node is None and self.rank is None:
            raise NoticeError("a notice needs a node or a rank (got neither)")
        if self.node is not None and (not isinstance(self.node, str) or not self.node.strip()):
            raise NoticeError(f"node must be a non-empty string, got {self.node!r}")
        if self.rank is not None and (not _is_int(self.rank) or self.rank < 0):
            raise NoticeError(f"rank must be an integer >= 0, got {self.rank!r}")
        if self.deadline is not None and not _is_epoch(self.deadline):
            raise _bad_deadline(self.deadline)
        _check_epoch("time", self.time)
        for name in ("reason", "slurm_state"):
            if not isinstance(getattr(self, name), str):
                raise NoticeError(f"{name} must be a string, got {getattr(self, name)!r}")

    @property
    def planned(self) -> bool:
        return self.kind == "maintenance"

    def to_json(self) -> str:
        """One line of JSON with every field."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, data: str | bytes | dict[str, Any], now: float | None = None) -> Notice:
        """Build a notice from JSON text or a decoded dict; raise NoticeError when it is invalid.

        ``deadline`` may be a number or any string :func:`parse_deadline` accepts (relative forms
        count from ``time``); ``time`` defaults to ``now`` (or the current time).
        """
        obj = _decode(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise NoticeError(f"unknown notice field(s) {unknown}; valid fields: {sorted(known)}")
        for required in ("kind", "source"):
            if required not in obj:
                raise NoticeError(
                    f"notice lacks {required!r}; valid values: {KINDS if required == 'kind' else SOURCES}"
                )
        obj.setdefault("time", _time.time() if now is None else now)
        _check_epoch("time", obj["time"])
        if isinstance(obj.get("deadline"), str):
            obj["deadline"] = parse_deadline(obj["deadline"], float(obj["time"]))
        return cls(**obj)


def parse_deadline(text: str | float | int | None, now: float) -> float | None:
    """A deadline in epoch seconds from ``text`` (see DEADLINE_FORMS); None stays None.

    ``now`` is the reference for ``now`` and ``+N<s|m|h>``. ISO times without an offset are local
    time. Raises NoticeError listing the accepted forms for anything else.
    """
    if text is None:
        return None
    if _is_number(text):
        return _checked_deadline(float(text), text)
    if not isinstance(text, str):
        raise _bad_deadline(text)
    value = text.strip()
    if value.lower() == "now":
        return float(now)
    m = re.fullmatch(r"\+(\d+(?:\.\d+)?)([smh])", value)
    if m:
        return float(now) + float(m.group(1)) * _UNITS[m.group(2)]
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return _checked_deadline(float(value), text)
    return _checked_deadline(_parse_iso(value, text), text)


def _parse_iso(value: str, text: object) -> float:
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise _bad_deadline(text) from None


def _checked_deadline(value: float, text: object) -> float:
    if not math.isfinite(value) or value < 0:
        raise _bad_deadline(text)
    return value


def _bad_deadline(text: object) -> NoticeError:
    return NoticeError(f"bad deadline {text!r}; accepted forms: {'; '.join(DEADLINE_FORMS)}")


def _decode(data: str | bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(data, dict):
        return dict(data)
    try:
        obj = json.loads(data)
    except (ValueError, TypeError) as exc:
        raise NoticeError(f"notice is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise NoticeError(f"notice must be a JSON object, got {type(obj).__name__}")
    return obj


def _check_choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise NoticeError(f"unknown notice {name} {value!r}; valid: {', '.join(repr(v) for v in valid)}")


def _check_epoch(name: str, value: object) -> None:
    if not _is_epoch(value):
        raise NoticeError(f"{name} must be epoch seconds (a finite number >= 0), got {value!r}")


def _is_epoch(value: object) -> bool:
    return isinstance(value, (int, float)) and _is_number(value) and math.isfinite(value) and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
