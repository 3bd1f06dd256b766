"""Turn Slurm node states and maintenance reservations into notices: a pure core and a thin poller.

Contract:
- :class:`NodeWatch` is pure (no I/O, no clock): :meth:`NodeWatch.observe` gets what Slurm said
  and the time, and returns the notices for *transitions* only. A watched node is reported once
  when it degrades (ok -> maintenance, ok -> failure); it is reported again only when the event
  escalates -- maintenance -> failure (a draining node that dies), or a maintenance deadline that
  moves more than a second earlier (a reservation announced for 11:00, then an immediate drain) --
  or after it was seen ok again and degrades anew. A failure is never "downgraded" by a notice.
- Classification is :func:`tmslurm.slurm.parse.classify`: drain / reboot requested / MAINT ->
  maintenance with ``deadline=None`` (as soon as possible); DOWN / NOT_RESPONDING / FAIL /
  FAILING / ... -> failure. A reservation with the MAINT flag that covers a watched node ->
  maintenance with ``deadline`` = its start (epoch, from Slurm's local time), reported as soon as
  it is seen, or only once it starts within ``maint_lead_s``; if it already started, deadline=now.
  Reservations that ended are ignored. Reservations without flags (``sinfo -T``) are not MAINT.
- Names Slurm reports that are not watched are ignored; a watched node missing from Slurm's output
  is neither reported nor considered recovered (absence is not a state).
- :class:`SlurmWatcher` polls a client from a daemon thread. A :class:`SlurmError` while polling
  is logged (rate-limited) and polling goes on; an exception in ``on_notice`` is logged too. The
  watcher never takes the run down. ``stop()`` sets a flag and joins the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tmslurm.core.errors import ConfigError, SlurmError
from tmslurm.core.notices import Notice
from tmslurm.slurm.parse import FAILURE, MAINTENANCE, NodeInfo, Reservation, classify

log = logging.getLogger(__name__)

ROLES = ("main", "spare")
_EARLIER_S = 1.0  # a maintenance deadline must move this much earlier to be reported again


@dataclass(frozen=True)
class _Event:
    kind: str
    deadline: float | None
    reason: str
    slurm_state: str


@dataclass
class _Reported:
    kind: str
    effective_deadline: float  # deadline, or the time reported when the deadline was "now"


class NodeWatch:
    """Which nodes matter (``node -> "main" | "spare"``) and what was already reported about them."""

    def __init__(self, nodes_of_interest: Mapping[str, str], *, maint_lead_s: float | None = None):
        if maint_lead_s is not None and maint_lead_s < 0:
            raise ConfigError(f"maint_lead_s must be >= 0 or None (report when seen), got {maint_lead_s}")
        self._lock = threading.Lock()
        self._maint_lead_s = maint_lead_s
        self._roles: dict[str, str] = {}
        self._reported: dict[str, _Reported] = {}
        self.set_nodes(nodes_of_interest)

    @property
    def nodes(self) -> dict[str, str]:
        """A copy of the watched nodes and their roles."""
        with self._lock:
            return dict(self._roles)

    def set_nodes(self, nodes_of_interest: Mapping[str, str]) -> None:
        """Replace the watched set (spares come and go); forget what was reported for dropped nodes."""
        bad = {n: r for n, r in nodes_of_interest.items() if r not in ROLES}
        if bad:
            raise ConfigError(f"unknown node role(s) {bad}; valid roles: {', '.join(ROLES)}")
        with self._lock:
            self._roles = dict(nodes_of_interest)
            self._reported = {n: r for n, r in self._reported.items() if n in self._roles}

    def observe(self, nodes: Iterable[NodeInfo], reservations: Iterable[Reservation], now: float) -> list[Notice]:
        """The notices for the transitions seen in this observation, sorted by node name."""
        with self._lock:
            seen = {n.name: n for n in nodes if n.name in self._roles}
            windows = self._maint_windows(reservations, now)
            notices = []
            for name in sorted(set(seen) | set(windows)):
                event = _event_for(seen.get(name), windows.get(name), now)
                notice = self._transition(name, event, name in seen, now)
                if notice is not None:
                    notices.append(notice)
            return notices

    def _maint_windows(self, reservations: Iterable[Reservation], now: float) -> dict[str, tuple[float, Reservation]]:
        """Watched node -> (start epoch, reservation) of its earliest relevant MAINT reservation."""
        windows: dict[str, tuple[float, Reservation]] = {}
        for resv in reservations:
            start, end = resv.start_time.timestamp(), resv.end_time.timestamp()
            if not resv.is_maint or end <= now:
                continue
            if self._maint_lead_s is not None and start - now > self._maint_lead_s:
                continue
            for node in resv.nodes:
                if node in self._roles and (node not in windows or start < windows[node][0]):
                    windows[node] = (start, resv)
        return windows

    def _transition(self, name: str, event: _Event | None, seen: bool, now: float) -> Notice | None:
        prev = self._reported.get(name)
        if event is None:
            if seen:
                self._reported.pop(name, None)  # back to ok: report the next degradation again
            return None
        effective = event.deadline if event.deadline is not None else now
        if prev is not None and not _escalates(prev, event.kind, effective):
            return None
        self._reported[name] = _Reported(event.kind, effective)
        log.info(
            "node %s (%s): %s, state %s, deadline %s: %s",
            name,
            self._roles[name],
            event.kind,
            event.slurm_state or "-",
            event.deadline,
            event.reason,
        )
        return Notice(
            kind=event.kind,
            node=name,
            source="slurm",
            reason=event.reason,
            deadline=event.deadline,
            slurm_state=event.slurm_state,
            time=now,
            role=self._roles[name],
        )


def _event_for(node: NodeInfo | None, window: tuple[float, Reservation] | None, now: float) -> _Event | None:
    state = node.state if node is not None else ""
    kind = classify(node) if node is not None else "ok"
    if node is not None and kind in (FAILURE, MAINTENANCE):
        return _Event(kind, None, node.reason or f"Slurm node state {state}", state)
    if window is not None:
        start, resv = window
        reason = (
            f"maintenance reservation {resv.name} on {resv.node_list or ','.join(resv.nodes)}"
            f" from {resv.start_time.isoformat()} to {resv.end_time.isoformat()}"
        )
        return _Event(MAINTENANCE, start if start > now else now, reason, state)
    return None


def _escalates(prev: _Reported, kind: str, effective_deadline: float) -> bool:
    if prev.kind == FAILURE:
        return False
    if kind == FAILURE:
        return True
    return effective_deadline < prev.effective_deadline - _EARLIER_S


class SlurmWatcher:
    """Poll ``client.nodes(watched)`` and ``client.reservations()`` every ``interval_s`` seconds.

    Each poll feeds :meth:`NodeWatch.observe` and hands every notice to ``on_notice`` (called from
    the watcher thread). Errors are logged, never raised: at most one warning per
    ``error_log_interval_s`` while Slurm keeps failing, and one line when it recovers.
    """

    def __init__(
        self,
        client,
        watch: NodeWatch,
        interval_s: float,
        on_notice: Callable[[Notice], None],
        *,
        error_log_interval_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ):
        if interval_s <= 0:
            raise ConfigError(f"watcher interval_s must be > 0, got {interval_s}")
        self._client = client
        self._watch = watch
        self._interval_s = interval_s
        self._on_notice = on_notice
        self._error_log_interval_s = error_log_interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._suppressed = 0
        self._last_error_log = float("-inf")

    def start(self) -> SlurmWatcher:
        """Start the daemon thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tmslurm-slurm-watcher", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop and join it (a poll in progress finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def poll_once(self) -> list[Notice]:
        """One poll: query Slurm, observe, deliver. Raises SlurmError (the thread catches it)."""
        names = sorted(self._watch.nodes)
        if not names:
            return []
        nodes = self._client.nodes(names)
        reservations = self._client.reservations()
        notices = self._watch.observe(nodes, reservations, self._clock())
        for notice in notices:
            self._deliver(notice)
        return notices

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll_safely()
            self._stop.wait(self._interval_s)

    def _poll_safely(self) -> None:
        try:
            self.poll_once()
        except SlurmError as exc:
            self._log_failure(exc)
            return
        except Exception:  # a bug must not kill the watcher thread silently either
            log.exception("Slurm watcher poll failed unexpectedly; polling continues")
            return
        if self._failures:
            log.info("Slurm polling recovered after %d failed poll(s)", self._failures)
            self._failures = self._suppressed = 0

    def _log_failure(self, exc: SlurmError) -> None:
        self._failures += 1
        now = time.monotonic()
        if now - self._last_error_log < self._error_log_interval_s:
            self._suppressed += 1
            return
        extra = f" ({self._suppressed} similar error(s) not logged)" if self._suppressed else ""
        log.warning("Slurm watcher poll failed%s; polling continues: %s", extra, exc)
        self._last_error_log, self._suppressed = now, 0

    def _deliver(self, notice: Notice) -> None:
        try:
            self._on_notice(notice)
        except Exception:
            log.exception("on_notice failed for %s; the watcher goes on", notice)
