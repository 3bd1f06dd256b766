"""The invariant checker of a chaos soak: did a run that took random faults stay correct?

Contract: :func:`check_run` reads only what a finished run left in its run directory
(:class:`~tmslurm.core.rundir.RunDir`): ``events.jsonl``, ``steps.jsonl``, ``summary.json`` and the notes
earlier Slurm jobs archived (``requeue-*.json``, ``controller-lost-*.json``); it signals nothing.
Invariants (docs/chaos.md): 1. ``commits``: each step from the start to the last is logged once per
incarnation chain, a step logged again only as the redo a restart/requeue started at its checkpoint
(``from_step``/``from_checkpoint_step`` + ``lost_steps``/``redo_steps``), each redo used once;
2. ``epochs``: within a Slurm job the epochs handed out (``event_begin``, ``abort``, ``recover``,
``restart``), each rank's ``groups`` and the step log's never go down, no two plans share one; 3. ``slots``: no rank is
served by two processes (agent id without its connection) in one epoch; 4. ``faults``: each injected
fault (journal ``fault``/``fault_firing`` per index, plus a driver's :class:`InjectedFault` list) of
a kind in :data:`REQUIRES_EVENT` has an event on an overlapping rank or node within ``max_lag_s``,
and each event has a fault (else a false alarm, listed with its cause); 5. ``processes``: no process
outlives the run, checked by pid only (the run does not record every process's end): each pid a
driver passes must be gone or a zombie in ``/proc`` (``os.kill(pid, 0)`` semantics, no signal),
SKIP without pids; 6. ``final_state``: both final hashes equal the reference run's (SKIP without one).

Failure behaviour: a missing file, a line of ``events.jsonl``/``steps.jsonl`` that is not a JSON
object (a torn line too) or not a journal record, or a summary that is not one
(:class:`~tmslurm.core.results.Summary`: one without the hash keys too) raises :class:`ChaosInputError`
naming the file (and line); a reference summary with a null hash raises it too; the CLI prints it
and exits 2. A violated invariant is a FAIL with its
offending records (CLI exit 1); SKIP fails nothing.
CLI: ``python -m tmslurm.tools.chaoscheck RUN_DIR [--reference-summary PATH] [--pid PID ...] [--json]``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tmslurm.controller.snapshot import read_steps
from tmslurm.controller.state import process_of
from tmslurm.core.errors import TmslurmError
from tmslurm.core.jsonfile import read_json_object
from tmslurm.core.results import Event, JournalEntry, Summary, load_journal, load_summary
from tmslurm.core.rundir import RunDir

log = logging.getLogger(__name__)

HASH_KEYS = ("final_state_sha256", "final_params_sha256")
REQUIRES_EVENT = ("kill", "stop", "hang", "drain", "node_down", "power_off", "partition", "controller_kill")
"""Fault kinds that must cause an event; the others (hiccup, slow, throttle, slowlink,
corrupt_shadow, a driver's own kinds) may cause one or none."""
JOB_STARTS = ("requeue", "resumed_after_requeue", "resumed_after_lost_controller", "resumed_after_unfinished_end")
"""Journal records at a Slurm job boundary: the next job's controller starts again at epoch 0."""
NOTES = {"requeue-*.json": "requeue_t", "controller-lost-*.json": "t"}
"""Archived notes of a job's end and the key of its time (after the job's last commit)."""
HANDED_OUT = ("event_begin", "abort", "recover", "restart")
SLACK_S = 1.0
"""How far before its fault an event may be stamped (the journal's writers take time separately)."""


class ChaosInputError(TmslurmError):
    """A file of the run directory is missing or unreadable; the message names it."""


@dataclass(kw_only=True, frozen=True)
class InjectedFault:
    """One fault: when (epoch seconds), what, and which ranks and/or nodes it hit."""

    t: float
    kind: str
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    index: int | None = None
    source: str = "driver"


@dataclass(kw_only=True)
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    offending: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True)
class CheckReport:
    run_dir: str
    checks: list[Check]
    faults_by_kind: dict[str, int]
    events_by_kind: dict[str, int]
    switches: int
    checkpoint_fallbacks: int
    downtime_s: dict[str, float | None]
    false_alarms: list[dict[str, Any]]
    passed: bool

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)


@dataclass(kw_only=True)
class RunFiles:
    journal: list[JournalEntry]
    steps: list[dict[str, Any]]
    summary: Summary
    notes: list[dict[str, Any]]


# ---- reading ---------------------------------------------------------------------------------
def _require_jsonl(path: Path) -> None:
    """Every non-empty line of ``path`` is a JSON object, or a ChaosInputError names the line."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise ChaosInputError(f"{path}: missing (is this the run directory of a finished run?)") from None
    except OSError as exc:
        raise ChaosInputError(f"{path}: unreadable: {exc}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            raise ChaosInputError(f"{path}:{n}: not a JSON object: {line[:120]!r}")


def read_json(path: Path, what: str) -> dict[str, Any]:
    return read_json_object(path, what, ChaosInputError)


def read_reference(path: Path) -> Summary:
    """The reference run's summary: both hashes set (its replicas agreed), or ChaosInputError naming it."""
    ref = load_summary(path, ChaosInputError)
    require_hashes(ref, path)
    return ref


def require_hashes(summary: Summary, where: Path | str) -> None:
    """Both hashes are set (not null: a run whose replicas diverged has none)."""
    missing = [k for k in HASH_KEYS if getattr(summary, k) is None]
    if missing:
        raise ChaosInputError(f"{where}: summary with a null {', '.join(missing)} (its replicas diverged?)")


def load_run(run_dir: Path) -> RunFiles:
    rd = RunDir(Path(run_dir))
    if not rd.path.is_dir():
        raise ChaosInputError(f"{rd.path}: not a directory")
    journal = load_journal(rd.events, ChaosInputError)
    _require_jsonl(rd.steps)
    summary = load_summary(rd.summary, ChaosInputError)
    notes = [
        {"t": read_json(p, "archived note").get(key), "note": p.name}
        for glob, key in NOTES.items()
        for p in sorted(rd.path.glob(glob))
    ]
    log.debug("%s: %d archived notes of earlier jobs", rd.path, len(notes))
    return RunFiles(journal=journal, steps=read_steps(rd.steps), summary=summary, notes=notes)


# ---- 1. commits ------------------------------------------------------------------------------
def redo_allowances(files: RunFiles, events: list[Event]) -> Counter[tuple[int, int]]:
    """How many redos from (checkpoint step, step reached before) restarts and requeues started:
    the most either source lists (the journal has every job's records, the events may lack some)."""
    journal: Counter[tuple[int, int]] = Counter()
    for e in files.journal:
        start, lost, redo = e.from_step, e.lost_steps, e.redo_steps
        if e.type == "restart" and start is not None and lost is not None:
            journal[start, start + lost] += 1
        elif e.type.startswith("resumed_after_") and start is not None and redo is not None:
            journal[start, start + redo] += 1
    evs = Counter(
        (e.from_checkpoint_step, e.from_checkpoint_step + e.lost_steps)
        for e in events
        if e.from_checkpoint_step is not None and e.lost_steps is not None
    )
    return Counter({k: n for k, n in (journal | evs).items() if k[1] > k[0]})


def check_commits(files: RunFiles, events: list[Event]) -> Check:
    steps, summary = files.steps, files.summary
    if not steps:
        return Check(name="commits", status="FAIL", detail="the step log is empty", offending=[])
    last = summary.steps - 1
    expected = min(steps[0]["step"], summary.resumed_from_step)
    start, bad = expected, []
    allowed = redo_allowances(files, events)
    for i, entry in enumerate(steps):
        s = entry["step"]
        if s > expected:
            bad.append({"problem": "gap", "missing": [expected, s - 1], "next_logged": entry, "index": i})
        elif s < expected:
            redo = next(((a, b) for a, b in sorted(+allowed) if a == s and a < expected <= b), None)
            if redo is None:
                first = next((e for e in reversed(steps[:i]) if e["step"] == s), entry)
                bad.append(
                    {
                        "problem": "duplicate",
                        "step": s,
                        "logged_up_to": expected - 1,
                        "entry": entry,
                        "index": i,
                        "journal_between": journal_between(files.journal, first.get("t_end"), entry.get("t_end")),
                    }
                )
            else:
                allowed[redo] -= 1
        expected = s + 1
    if expected - 1 < last:
        bad.append({"problem": "gap", "missing": [expected, last], "at": "end of the step log"})
    elif expected - 1 > last:
        bad.append({"problem": "beyond the summary's last step", "logged_up_to": expected - 1, "last": last})
    detail = f"steps {start}..{last}: {len(steps)} log entries"
    return Check(name="commits", status="FAIL" if bad else "PASS", detail=detail, offending=bad)


CONTEXT_KEYS = (
    "kind",
    "step",
    "from_step",
    "lost_steps",
    "redo_steps",
    "target_step",
    "epoch",
    "incarnation",
    "ranks",
    "cause",
    "why",
    "reason",
)


def journal_between(journal: list[JournalEntry], t0: Any, t1: Any, most: int = 40) -> list[str]:
    """The journal records stamped from ``t0`` to ``t1`` (what happened between two commits of one
    step), one short line each with the keys that say why steps were redone; [] without both times."""
    if not isinstance(t0, (int, float)) or not isinstance(t1, (int, float)):
        return []
    out = []
    for e in journal:
        if t0 <= e.t <= t1:
            rec = e.record()
            keys = " ".join(f"{k}={str(rec[k])[:80]}" for k in CONTEXT_KEYS if k in rec)
            out.append(f"{e.t - t0:+.2f}s {e.type} {keys}")
    return out if len(out) <= most else out[: most // 2] + [f"... {len(out) - most} more ..."] + out[-most // 2 :]


# ---- 2. epochs -------------------------------------------------------------------------------
def job_start_times(files: RunFiles) -> list[float]:
    """When Slurm jobs of the run ended and the next took over (journal records, archived notes)."""
    notes = [float(n["t"]) for n in files.notes if isinstance(n.get("t"), (int, float))]
    return sorted([e.t for e in files.journal if e.type in JOB_STARTS] + notes)


R = TypeVar("R")


def with_jobs(recs: list[R], starts: list[float], time_of: Callable[[R], Any]) -> Iterable[tuple[int, R]]:
    """Each record with its Slurm job (how many job boundaries lie before its time)."""
    job = 0
    for rec in recs:
        t = time_of(rec)
        job = bisect.bisect_left(starts, t) if isinstance(t, (int, float)) else job
        yield job, rec


def _t(e: JournalEntry) -> float:
    return e.t


def _t_end(step: dict[str, Any]) -> Any:
    return step.get("t_end")


def check_epochs(files: RunFiles) -> Check:
    starts = job_start_times(files)
    handed = [
        (e.epoch, e)
        for e in files.journal
        if e.type in HANDED_OUT
        and e.epoch is not None
        and not (e.type == "event_begin" and e.kind == "controller_restart")
    ]  # the epoch in force
    bad = _went_down(with_jobs(handed, starts, lambda p: p[1].t), "journal epoch went down")
    plans: dict[tuple[int, int], JournalEntry] = {}
    for job, (epoch, e) in with_jobs(handed, starts, lambda p: p[1].t):
        if e.type in ("event_begin", "restart"):
            if (job, epoch) in plans:
                bad.append(
                    {"problem": "epoch handed out twice", "first": plans[job, epoch].record(), "record": e.record()}
                )
            plans[job, epoch] = e
    steps = [(e["epoch"], e) for e in files.steps if isinstance(e.get("epoch"), int)]
    bad += _went_down(with_jobs(steps, starts, lambda p: _t_end(p[1])), "step log epoch went down")
    groups = [(e.epoch, e) for e in files.journal if e.type == "groups" and e.rank is not None and e.epoch is not None]
    for rank in sorted(
        {r for _, e in groups if (r := e.rank) is not None}
    ):  # each rank's groups, built for the epoch in force
        mine = [p for p in groups if p[1].rank == rank]
        bad += _went_down(with_jobs(mine, starts, lambda p: p[1].t), f"rank {rank}'s groups epoch went down")
    return Check(
        name="epochs",
        status="FAIL" if bad else "PASS",
        offending=bad,
        detail=f"{len(handed)} handed-out epochs, {len(groups)} groups records, {len(steps)} step log "
        f"entries, {len(starts)} job boundary records",
    )


def _went_down(recs: Iterable[tuple[int, tuple[int, Any]]], problem: str) -> list[dict[str, Any]]:
    """(job, (epoch, record)) in time order: every record whose epoch is below the one before it in its job."""
    bad, prev, prev_job = [], None, 0
    for job, (epoch, rec) in recs:
        if prev is not None and job == prev_job and epoch < prev[0]:
            bad.append({"problem": problem, "before": _plain(prev[1]), "record": _plain(rec)})
        prev, prev_job = (epoch, rec), job
    return bad


def _plain(rec: Any) -> dict[str, Any]:
    """A record as JSON-ready fields (a journal record) or itself (a step log entry)."""
    return rec.record() if isinstance(rec, JournalEntry) else rec


# ---- 3. slots --------------------------------------------------------------------------------
def serving_claims(
    journal: list[JournalEntry], starts: list[float]
) -> list[tuple[tuple[int, int, int], str, JournalEntry]]:
    """((job, epoch, rank), process, record) for every record saying a process serves a rank in an
    epoch; a worker's ``agent_up`` serves its own rank in the epoch in force (the last ``restart``,
    ``adopted`` or ``joined``; 0 when a Slurm job starts)."""
    out, epoch, last_job = [], 0, 0
    for job, e in with_jobs(journal, starts, _t):
        kind, aid = e.type, e.agent
        epoch, last_job = (0 if job != last_job else epoch), job
        if kind in ("restart", "adopted", "joined") and e.epoch is not None:
            epoch = e.epoch
        if kind == "agent_up" and aid is not None and aid.startswith("worker"):
            rank = aid[len("worker") :].split(".", 1)[0]
            if rank.isdigit():
                out.append(((job, epoch, int(rank)), process_of(aid), e))
        elif kind == "joined" or (kind == "late_join" and e.extra("outcome") == "adopted"):
            if e.epoch is not None and e.rank is not None and aid is not None:
                out.append(((job, e.epoch, e.rank), process_of(aid), e))
    return out


def check_slots(files: RunFiles) -> Check:
    seen: dict[tuple[int, int, int], dict[str, JournalEntry]] = {}
    bad: list[dict[str, Any]] = []
    claims = serving_claims(files.journal, job_start_times(files))
    for slot, proc, rec in claims:
        seen.setdefault(slot, {}).setdefault(proc, rec)
    for (job, epoch, rank), procs in sorted(seen.items()):
        if len(procs) > 1:
            bad.append(
                {
                    "problem": "two processes in one slot",
                    "job": job,
                    "epoch": epoch,
                    "rank": rank,
                    "records": [r.record() for r in procs.values()],
                }
            )
    return Check(
        name="slots",
        status="FAIL" if bad else "PASS",
        offending=bad,
        detail=f"{len(claims)} serving records over {len(seen)} (epoch, rank) slots",
    )


# ---- 4. faults and events --------------------------------------------------------------------
def journal_faults(journal: list[JournalEntry]) -> list[InjectedFault]:
    """One fault per index of the journal's ``fault``/``fault_firing`` records, at its earliest time
    (``at``, the instant it fired, where the record has one)."""
    by_index: dict[int, list[JournalEntry]] = {}
    for e in journal:
        if e.type in ("fault", "fault_firing") and e.index is not None:
            by_index.setdefault(e.index, []).append(e)
    out = []
    for index, recs in sorted(by_index.items()):
        ranks = {r for e in recs for r in (e.ranks or ([] if e.rank is None else [e.rank]))}
        nodes = {n for e in recs for n in (e.nodes or ([e.node] if e.node else []))}
        t = min(float(e.extra("at") or e.t) for e in recs)
        out.append(
            InjectedFault(
                t=t,
                kind=str(recs[0].kind),
                ranks=tuple(sorted(ranks)),
                nodes=tuple(sorted(nodes)),
                index=index,
                source="journal",
            )
        )
    return out


def run_events(files: RunFiles) -> list[Event]:
    """The summary's events, plus completed ones (journal ``event``) it lost with an earlier job,
    plus the notices still pending at the end (kind ``pending_notice``: the run saw the fault and was
    waiting, e.g. for a warm standby, when the run ended or the admin withdrew it)."""
    events = list(files.summary.events)
    keys = {_event_key(e) for e in events}
    for line in files.journal:
        if line.type == "event" and _event_key(e := line.event()) not in keys:
            keys.add(_event_key(e))
            events.append(e)
    for n in files.summary.pending_notices:
        events.append(
            Event(
                kind="pending_notice",
                cause=n.reason,
                node=n.node or "",
                ranks=[] if n.rank is None else [n.rank],
                notice_t=n.time,
            )
        )
    return sorted(events, key=lambda e: _event_t(e) or 0.0)


def _event_key(e: Event) -> tuple[Any, ...]:
    return e.kind, e.epoch, e.notice_t, e.target_step


def _event_t(e: Event) -> float | None:
    return next((t for t in (e.notice_t, e.switched_t, e.first_step_t) if t is not None), None)


def _overlap(f: InjectedFault, e: Event) -> bool:
    ranks = set(e.ranks)
    nodes = {n for n in (e.node or "").split(",") if n}
    if not (f.ranks or f.nodes) or not (ranks or nodes):
        return True  # a job-wide fault or event: any on the other side may be its match
    return bool(set(f.ranks) & ranks or set(f.nodes) & nodes)


def matches(f: InjectedFault, e: Event, max_lag_s: float) -> bool:
    t = _event_t(e)
    return t is not None and -SLACK_S <= t - f.t <= max_lag_s and _overlap(f, e)


def check_faults(
    faults: list[InjectedFault], events: list[Event], max_lag_s: float
) -> tuple[Check, list[dict[str, Any]]]:
    unexplained = [f for f in faults if f.kind in REQUIRES_EVENT and not any(matches(f, e, max_lag_s) for e in events)]
    alarms = [
        {"kind": e.kind, "cause": e.cause, "epoch": e.epoch, "ranks": e.ranks, "node": e.node, "t": _event_t(e)}
        for e in events
        if not any(matches(f, e, max_lag_s) for f in faults)
    ]
    bad = [{"problem": "fault without event", **asdict(f)} for f in unexplained]
    bad += [{"problem": "event without fault (false alarm)", **a} for a in alarms]
    detail = f"{len(faults)} faults, {len(events)} events, window -{SLACK_S:g}..{max_lag_s:g} s"
    return Check(name="faults", status="FAIL" if bad else "PASS", detail=detail, offending=bad), alarms


# ---- 5. processes ----------------------------------------------------------------------------
def proc_alive(pid: int) -> tuple[bool, str]:
    """Whether ``pid`` exists and is not a zombie (read from /proc; nothing is signalled), with its state."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False, "gone"
    except OSError as exc:
        return True, f"unreadable: {exc}"  # it exists (as os.kill(pid, 0) with EPERM says)
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("Z", "X"), state


def check_processes(journal: list[JournalEntry], pids: Iterable[int] | None) -> Check:
    started = [e for e in journal if e.type == "agent_up"]
    if pids is None:
        return Check(
            name="processes",
            status="SKIP",
            detail=f"{len(started)} agents started; the run directory does not record every process's "
            "end, so this needs the pids a driver collected (--pid)",
        )
    bad = []
    for pid in sorted(set(pids)):
        alive, state = proc_alive(pid)
        if alive:
            by = next((e.record() for e in started if e.pid == pid), None)
            bad.append({"problem": "process outlives the run", "pid": pid, "state": state, "agent_up": by})
    return Check(
        name="processes",
        status="FAIL" if bad else "PASS",
        offending=bad,
        detail=f"checked by pid on this host: {len(set(pids))} pids ({len(started)} agents started)",
    )


# ---- 6. final state --------------------------------------------------------------------------
def check_final(summary: Summary, reference: Summary | None) -> Check:
    if reference is None:
        return Check(name="final_state", status="SKIP", detail="no reference summary given")
    require_hashes(reference, "the reference summary")
    bad = [
        {"problem": f"{k} differs", "run": getattr(summary, k), "reference": getattr(reference, k)}
        for k in HASH_KEYS
        if getattr(summary, k) is None or getattr(summary, k) != getattr(reference, k)
    ]
    if bad and summary.diverging:
        bad.append({"problem": "replicas diverged", "diverging": summary.diverging})
    return Check(
        name="final_state",
        status="FAIL" if bad else "PASS",
        offending=bad,
        detail="final_state_sha256 and final_params_sha256 against the reference",
    )


# ---- the report ------------------------------------------------------------------------------
def quantile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not xs:
        return None
    xs, pos = sorted(xs), q * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def downtime(events: list[Event]) -> dict[str, float | None]:
    xs = [d for e in events if (d := e.part("downtime_s")) is not None]
    return {"n": len(xs), "p50": quantile(xs, 0.5), "p90": quantile(xs, 0.9), "max": max(xs, default=None)}


def check_run(
    run_dir: Path,
    *,
    reference: Summary | None = None,
    faults: list[InjectedFault] | None = None,
    pids: Iterable[int] | None = None,
    max_lag_s: float = 120.0,
) -> CheckReport:
    """Check the six invariants on ``run_dir``; raises :class:`ChaosInputError` on bad input."""
    files = load_run(Path(run_dir))
    events = run_events(files)
    recorded = journal_faults(files.journal)
    known = {f.index for f in recorded}
    all_faults = recorded + [f for f in faults or [] if f.index is None or f.index not in known]  # each fault once
    fault_check, alarms = check_faults(all_faults, events, max_lag_s)
    checks = [
        check_commits(files, events),
        check_epochs(files),
        check_slots(files),
        fault_check,
        check_processes(files.journal, pids),
        check_final(files.summary, reference),
    ]
    switches = sum(1 for e in events if e.kind in ("planned", "unexpected"))
    fallbacks = sum(1 for e in events if e.from_checkpoint_step is not None)
    return CheckReport(
        run_dir=str(run_dir),
        checks=checks,
        faults_by_kind=dict(Counter(f.kind for f in all_faults)),
        events_by_kind=dict(Counter(e.kind for e in events)),
        switches=switches,
        checkpoint_fallbacks=fallbacks,
        downtime_s=downtime(events),
        false_alarms=alarms,
        passed=not any(c.status == "FAIL" for c in checks),
    )


def format_report(report: CheckReport) -> str:
    lines = [f"chaos check of {report.run_dir}"]
    for c in report.checks:
        lines.append(f"{c.status:4}  {c.name}: {c.detail}")
        lines += [f"        {json.dumps(o, default=str)[:600]}" for o in c.offending]
    d = report.downtime_s
    fmt = lambda v: "-" if v is None else f"{v:.3f}s"  # noqa: E731
    lines += [
        f"faults by kind: {report.faults_by_kind}",
        f"events by kind: {report.events_by_kind}",
        f"switches {report.switches}, checkpoint fallbacks {report.checkpoint_fallbacks}, "
        f"false alarms {len(report.false_alarms)}",
        f"downtime over {d['n']} events: p50 {fmt(d['p50'])} p90 {fmt(d['p90'])} max {fmt(d['max'])}",
        "PASSED" if report.passed else "FAILED",
    ]
    return "\n".join(lines)


def driver_faults(path: Path) -> list[InjectedFault]:
    """A driver's faults file: a JSON list of {t, kind, ranks?, nodes?, index?}."""
    try:
        items = json.loads(path.read_text())
        return [
            InjectedFault(
                t=float(i["t"]),
                kind=str(i["kind"]),
                ranks=tuple(i.get("ranks", ())),
                nodes=tuple(i.get("nodes", ())),
                index=i.get("index"),
            )
            for i in items
        ]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ChaosInputError(f"{path}: unreadable faults list: {exc!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tmslurm.tools.chaoscheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--reference-summary", type=Path, help="summary.json of the uninterrupted run")
    ap.add_argument("--faults", type=Path, help="JSON list of faults the driver injected: {t, kind, ranks, nodes}")
    ap.add_argument("--pid", type=int, action="append", help="a pid the driver started (repeat); checked gone")
    ap.add_argument("--max-lag-s", type=float, default=120.0, help="longest fault-to-event delay (default 120)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    try:
        ref = read_reference(args.reference_summary) if args.reference_summary else None
        faults = driver_faults(args.faults) if args.faults else None
        report = check_run(args.run_dir, reference=ref, faults=faults, pids=args.pid, max_lag_s=args.max_lag_s)
    except ChaosInputError as exc:
        print(f"chaoscheck: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else format_report(report))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
