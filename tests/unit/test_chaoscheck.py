"""tmslurm.tools.chaoscheck on synthetic run directories (one passing and failing cases per invariant),
bad input, the CLI, and one real short local run with a kill and a drain against its reference."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tmslurm.core.results import Summary
from tmslurm.tools.chaoscheck import ChaosInputError, InjectedFault, check_run, main

T0 = 1_700_000_000.0
H = {"final_state_sha256": "aa" * 32, "final_params_sha256": "bb" * 32}
RUN = {"run_id": "r", "layout": {"dp": 2, "pp": 2}, "events": []}
"""What every summary holds besides the fields a case sets."""


def _reference(**over: Any) -> Summary:
    return Summary.parse({**RUN, "steps": 20, **H, **over}, "test reference")


def _event(kind: str, epoch: int, ranks: list[int], t: float, **more: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "cause": f"{kind} of {ranks}",
        "epoch": epoch,
        "ranks": ranks,
        "node": "n1",
        "notice_t": t,
        "status": "done",
        "downtime_s": 0.5 + epoch,
        **more,
    }


def switch_run() -> dict[str, Any]:
    """20 steps; a kill of rank 1 at step 10 (unexpected switch, epoch 1), a drain of rank 2 at step 15
    (planned switch, epoch 2); a worker that rejoined a restarted controller (same pid, new connection)."""
    j = [{"t": T0, "type": "agent_up", "agent": f"worker{r}.{100 + r}#{r}", "pid": 100 + r} for r in range(4)]
    j += [
        {"t": T0, "type": "agent_up", "agent": "standby0.500#5", "pid": 500},
        {"t": T0 + 3, "type": "agent_up", "agent": "worker3.103#9", "pid": 103},
        {"t": T0 + 10.2, "type": "fault", "index": 0, "rank": 1, "step": 10, "kind": "kill"},
        {"t": T0 + 10.3, "type": "event_begin", **_event("unexpected", 1, [1], T0 + 10.2)},
        {"t": T0 + 10.3, "type": "abort", "epoch": 1, "step": 10, "dead": [1]},
        {"t": T0 + 10.4, "type": "recover", "epoch": 1, "moves": [{"rank": 1, "joiner": "standby0.500#5"}]},
        {"t": T0 + 10.6, "type": "joined", "agent": "standby0.500#5", "rank": 1, "epoch": 1},
        {"t": T0 + 10.9, "type": "event", **_event("unexpected", 1, [1], T0 + 10.2)},
        {"t": T0 + 15.0, "type": "fault_firing", "index": 1, "kind": "drain", "rank": 2, "ranks": [2]},
        {"t": T0 + 15.1, "type": "event_begin", **_event("planned", 2, [2], T0 + 15.0)},
        {"t": T0 + 15.6, "type": "joined", "agent": "standby1.501#6", "rank": 2, "epoch": 2},
        {"t": T0 + 15.9, "type": "event", **_event("planned", 2, [2], T0 + 15.0)},
    ]
    steps = [{"step": s, "t_end": T0 + s + 0.9, "epoch": 0 if s < 11 else 1 if s < 16 else 2} for s in range(20)]
    summary = {
        **RUN,
        "steps": 20,
        "resumed_from_step": 0,
        **H,
        "events": [_event("unexpected", 1, [1], T0 + 10.2), _event("planned", 2, [2], T0 + 15.0)],
    }
    return {"journal": j, "steps": steps, "summary": summary}


def restart_run() -> dict[str, Any]:
    """A kill of rank 0 after step 12 with no standby: every rank restarts from checkpoint 8 (epoch 1)
    and redoes steps 8..12, then goes on to 19; new worker processes serve the ranks in epoch 1."""
    run = switch_run()
    j = [e for e in run["journal"][:4]]
    j += [
        {"t": T0 + 13.1, "type": "fault", "index": 0, "rank": 0, "step": 13, "kind": "kill"},
        {"t": T0 + 13.5, "type": "restart", "epoch": 1, "cause": "process exit", "from_step": 8, "lost_steps": 5},
    ]
    j += [
        {"t": T0 + 14, "type": "agent_up", "agent": f"worker{r}.{200 + r}#{10 + r}", "pid": 200 + r} for r in range(4)
    ]
    ev = _event("restart", 1, [0], T0 + 13.1, from_checkpoint_step=8, lost_steps=5, target_step=13)
    j.append({"t": T0 + 20, "type": "event", **ev})
    steps = [{"step": s, "t_end": T0 + s + 0.9, "epoch": 0} for s in range(13)]
    steps += [{"step": s, "t_end": T0 + 10 + s, "epoch": 1} for s in range(8, 20)]
    run.update(journal=j, steps=steps)
    run["summary"]["events"] = [ev]
    return run


def requeue_run() -> dict[str, Any]:
    """A drain of rank 3 at step 5 (planned switch, epoch 1); a kill of rank 0 after step 12 with
    bench.restart_mode=requeue_restart: the next Slurm job starts again at epoch 0 with new
    workers, resumes from checkpoint 8 and redoes 8..12 (its note archived as requeue-<t>.json)."""
    run = switch_run()
    planned = _event("planned", 1, [3], T0 + 5.0)
    requeue = _event("requeue_restart", 0, [0], T0 + 13.1, from_checkpoint_step=8, lost_steps=5, target_step=13)
    j = run["journal"][:4]
    j += [
        {"t": T0 + 5.0, "type": "fault_firing", "index": 0, "kind": "drain", "rank": 3, "ranks": [3]},
        {"t": T0 + 5.1, "type": "event_begin", **planned},
        {"t": T0 + 5.5, "type": "joined", "agent": "standby0.500#5", "rank": 3, "epoch": 1},
        {"t": T0 + 5.9, "type": "event", **planned},
        {"t": T0 + 13.1, "type": "fault", "index": 1, "rank": 0, "step": 13, "kind": "kill"},
        {"t": T0 + 13.5, "type": "requeue", "cause": "process exit", "target_step": 13, "kind": "requeue_restart"},
        {"t": T0 + 30.0, "type": "resumed_after_requeue", "from_step": 8, "reschedule_s": 16.5},
    ]
    j += [{"t": T0 + 31, "type": "agent_up", "agent": f"worker{r}.{300 + r}#{r}", "pid": 300 + r} for r in range(4)]
    j.append({"t": T0 + 40, "type": "event", **requeue})
    steps = [{"step": s, "t_end": T0 + s + 0.9, "epoch": 0 if s < 6 else 1} for s in range(13)]
    steps += [{"step": s, "t_end": T0 + 30 + s, "epoch": 0} for s in range(8, 20)]
    run.update(journal=j, steps=steps, note={"requeue_t": T0 + 13.5, "target_step": 13})
    run["summary"].update(events=[planned, requeue], resumed_from_step=8)
    return run


def _lost_controller(r, logged_beyond: int):
    """The requeue was a node monitor's after the controller was lost: its redo counted ``logged_beyond``
    commits short of the step log (0: counted right, from the step log)."""
    _no_journal_boundary(r)
    j = [e for e in r["journal"] if e.get("kind") != "requeue_restart"]
    j.insert(
        -5,
        {
            "t": T0 + 30.0,
            "type": "resumed_after_lost_controller",
            "from_step": 8,
            "redo_steps": 5 - logged_beyond,
            "last_committed": 13 - logged_beyond,
        },
    )
    r["journal"] = j
    ev = r["summary"]["events"][1]
    ev.update(kind="controller_lost_requeue", lost_steps=5 - logged_beyond, target_step=13 - logged_beyond)
    r["journal"].append({"t": T0 + 40, "type": "event", **ev})


def _no_journal_boundary(r):
    r["journal"] = [e for e in r["journal"] if e["type"] not in ("requeue", "resumed_after_requeue")]


def _no_boundary(r):
    _no_journal_boundary(r)
    del r["note"]


def write_run(root: Path, run: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in run["journal"]))
    (root / "steps.jsonl").write_text("".join(json.dumps(e) + "\n" for e in run["steps"]))
    (root / "summary.json").write_text(json.dumps(run["summary"]))
    if "note" in run:
        (root / f"requeue-{int(run['note']['requeue_t'])}.json").write_text(json.dumps(run["note"]))
    return root


def _dup_step(r):
    r["steps"].insert(8, dict(r["steps"][7]))


def _gap(r):
    del r["steps"][12]


def _short(r):
    del r["steps"][-2:]


def _redo_wrong_start(r):
    r["steps"] = [s for s in r["steps"] if not (s["epoch"] == 1 and s["step"] == 8)]  # redo starts at 9


def _restart_twice(r):
    """A second kill at step 13 of the redo: a second restart from the same checkpoint to the same step."""
    i = next(i for i, s in enumerate(r["steps"]) if s["epoch"] == 1 and s["step"] == 13)
    r["steps"][i:i] = [{"step": s, "t_end": T0 + 10 + s, "epoch": 1} for s in range(8, 13)]
    for k, entry in enumerate(r["steps"][i:], i):
        r["steps"][k] = dict(entry, epoch=2, t_end=T0 + 15 + entry["step"])
    r["journal"] += [
        {"t": T0 + 22.1, "type": "fault", "index": 1, "rank": 0, "step": 13, "kind": "kill"},
        {"t": T0 + 22.5, "type": "restart", "epoch": 2, "from_step": 8, "lost_steps": 5},
    ]
    r["summary"]["events"].append(_event("restart", 2, [0], T0 + 22.1, from_checkpoint_step=8, lost_steps=5))


def _redo_twice(r):
    r["steps"] += [dict(s, epoch=1) for s in r["steps"] if 8 <= s["step"] < 20 and s["epoch"] == 1]


def _epoch_down_journal(r):
    r["journal"].append({"t": T0 + 17, "type": "event_begin", **_event("planned", 1, [3], T0 + 17)})


def _epoch_down_steps(r):
    r["steps"][17]["epoch"] = 1


def _groups_epoch_down(r):
    r["journal"] += [
        {"t": T0 + 16, "type": "groups", "rank": 3, "step": 16, "epoch": 2},
        {"t": T0 + 17, "type": "groups", "rank": 0, "step": 16, "epoch": 2},
        {"t": T0 + 17, "type": "groups", "rank": 3, "step": 17, "epoch": 1},
    ]


def _groups_interleaved(r):
    r["journal"] += [
        {"t": T0 + 16, "type": "groups", "rank": 3, "step": 16, "epoch": 2},
        {"t": T0 + 17, "type": "groups", "rank": 0, "step": 16, "epoch": 1},
    ]


def _epoch_twice(r):
    r["journal"].append({"t": T0 + 17, "type": "restart", "epoch": 2, "from_step": 17, "lost_steps": 0})


def _two_in_slot(r):
    r["journal"].append({"t": T0 + 10.7, "type": "joined", "agent": "standby2.502#7", "rank": 1, "epoch": 1})


def _two_workers(r):
    r["journal"].insert(3, {"t": T0, "type": "agent_up", "agent": "worker2.300#12", "pid": 300})


def _fault_without_event(r):
    r["journal"].append({"t": T0 + 18, "type": "fault", "index": 2, "rank": 3, "step": 18, "kind": "kill"})


def _event_without_fault(r):
    r["journal"] = [e for e in r["journal"] if not (e["type"] == "fault" and e["index"] == 0)]


def _event_too_late(r):
    r["summary"]["events"][0]["notice_t"] = T0 + 500


def _hiccup_no_event(r):
    r["journal"].append({"t": T0 + 18, "type": "fault", "index": 2, "rank": 3, "step": 18, "kind": "hiccup"})


CASES: list[tuple[str, Callable[[], dict], Callable | None, str, str]] = [
    ("switches pass", switch_run, None, "commits", "PASS"),
    ("restart redo passes", restart_run, None, "commits", "PASS"),
    ("duplicate commit", switch_run, _dup_step, "commits", "FAIL"),
    ("gap", switch_run, _gap, "commits", "FAIL"),
    ("log ends early", switch_run, _short, "commits", "FAIL"),
    ("redo not from its checkpoint", restart_run, _redo_wrong_start, "commits", "FAIL"),
    ("redo twice", restart_run, _redo_twice, "commits", "FAIL"),
    ("two restarts from one checkpoint", restart_run, _restart_twice, "commits", "PASS"),
    ("requeue redo passes", requeue_run, None, "commits", "PASS"),
    (
        "lost controller: redo counted from the step log",
        requeue_run,
        lambda r: _lost_controller(r, 0),
        "commits",
        "PASS",
    ),
    ("lost controller: redo one commit short", requeue_run, lambda r: _lost_controller(r, 1), "commits", "FAIL"),
    ("epochs pass", switch_run, None, "epochs", "PASS"),
    ("requeue starts at epoch 0 again", requeue_run, None, "epochs", "PASS"),
    ("job boundary from the archived note", requeue_run, _no_journal_boundary, "epochs", "PASS"),
    ("epoch 0 again without a job boundary", requeue_run, _no_boundary, "epochs", "FAIL"),
    ("restart epochs pass", restart_run, None, "epochs", "PASS"),
    ("journal epoch goes down", switch_run, _epoch_down_journal, "epochs", "FAIL"),
    ("step log epoch goes down", switch_run, _epoch_down_steps, "epochs", "FAIL"),
    ("epoch handed out twice", switch_run, _epoch_twice, "epochs", "FAIL"),
    ("ranks' groups epochs interleave", switch_run, _groups_interleaved, "epochs", "PASS"),
    ("a rank's groups epoch goes down", switch_run, _groups_epoch_down, "epochs", "FAIL"),
    ("slots pass (rejoin is one process)", switch_run, None, "slots", "PASS"),
    ("restart slots pass", restart_run, None, "slots", "PASS"),
    ("requeue slots pass", requeue_run, None, "slots", "PASS"),
    ("two agents in one slot and epoch", switch_run, _two_in_slot, "slots", "FAIL"),
    ("two worker processes for a rank", switch_run, _two_workers, "slots", "FAIL"),
    ("faults pass", switch_run, None, "faults", "PASS"),
    ("restart faults pass", restart_run, None, "faults", "PASS"),
    ("requeue faults pass", requeue_run, None, "faults", "PASS"),
    ("hiccup needs no event", switch_run, _hiccup_no_event, "faults", "PASS"),
    ("fault without event", switch_run, _fault_without_event, "faults", "FAIL"),
    ("event without fault", switch_run, _event_without_fault, "faults", "FAIL"),
    ("event long after its fault", switch_run, _event_too_late, "faults", "FAIL"),
]


@pytest.mark.parametrize("make,mutate,check,status", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invariant(tmp_path, make, mutate, check, status):
    run = make()
    if mutate is not None:
        mutate(run)
    report = check_run(write_run(tmp_path / "run", run))
    (got,) = [c for c in report.checks if c.name == check]
    assert got.status == status, (got.detail, got.offending)
    assert bool(got.offending) == (status == "FAIL")
    assert report.passed == (status == "PASS")


def test_a_duplicate_lists_what_the_journal_says_between_its_two_commits(tmp_path):
    """A step logged again with no redo to allow it: the report shows the journal from its first commit
    to the second, which says why (here the restart's record counts 4 of the 5 steps it redoes)."""
    run = restart_run()
    run["journal"] = [{**e, "lost_steps": 4} if e["type"] == "restart" else e for e in run["journal"]]
    run["summary"]["events"] = [
        {**e, "lost_steps": 4} if e.get("kind") == "restart" else e for e in run["summary"]["events"]
    ]
    report = check_run(write_run(tmp_path / "run", run))
    (bad,) = [o for c in report.checks if c.name == "commits" for o in c.offending]
    assert (bad["problem"], bad["step"], bad["logged_up_to"]) == ("duplicate", 8, 12), bad
    assert [line.split()[1] for line in bad["journal_between"]] == ["fault", "restart", *["agent_up"] * 4], bad
    assert "from_step=8 lost_steps=4" in bad["journal_between"][1]


def test_false_alarm_is_reported_with_its_cause(tmp_path):
    run = switch_run()
    _event_without_fault(run)
    report = check_run(write_run(tmp_path / "run", run))
    assert [(a["kind"], a["cause"]) for a in report.false_alarms] == [("unexpected", "unexpected of [1]")]


def test_driver_fault_explains_an_event(tmp_path):
    run = switch_run()
    _event_without_fault(run)
    fault = InjectedFault(t=T0 + 10.0, kind="sigkill_by_driver", ranks=(1,))
    report = check_run(write_run(tmp_path / "run", run), faults=[fault])
    assert report.passed and report.faults_by_kind == {"drain": 1, "sigkill_by_driver": 1}
    again = InjectedFault(t=T0 + 15.0, kind="drain", ranks=(2,), index=1)  # the journal has it: counted once
    assert check_run(tmp_path / "run", faults=[fault, again]).faults_by_kind == {"drain": 1, "sigkill_by_driver": 1}


def test_final_state(tmp_path):
    path = write_run(tmp_path / "run", switch_run())
    assert check_run(path).checks[-1].status == "SKIP"
    assert check_run(path, reference=_reference()).checks[-1].status == "PASS"
    bad = check_run(path, reference=_reference(final_state_sha256="cc" * 32))
    assert bad.checks[-1].status == "FAIL" and not bad.passed
    assert bad.checks[-1].offending[0]["problem"] == "final_state_sha256 differs"
    with pytest.raises(ChaosInputError, match="reference"):
        check_run(path, reference=_reference(final_params_sha256=None))


def test_cli_reference_without_hashes_names_it(tmp_path, capsys):
    path = write_run(tmp_path / "run", switch_run())
    ref = tmp_path / "ref-summary.json"
    ref.write_text(json.dumps({"steps": 20}))
    assert main([str(path), "--reference-summary", str(ref)]) == 2
    assert "ref-summary.json" in capsys.readouterr().err


def test_processes_checked_by_pid(tmp_path):
    path = write_run(tmp_path / "run", switch_run())
    assert check_run(path).checks[4].status == "SKIP"
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = check_run(path, pids=[int(done.stdout)]).checks[4]
    assert gone.status == "PASS" and "by pid" in gone.detail
    alive = check_run(path, pids=[os.getpid()]).checks[4]
    assert alive.status == "FAIL" and alive.offending[0]["pid"] == os.getpid()


def test_report_numbers(tmp_path):
    report = check_run(write_run(tmp_path / "run", switch_run()))
    assert report.faults_by_kind == {"kill": 1, "drain": 1}
    assert report.events_by_kind == {"unexpected": 1, "planned": 1}
    assert (report.switches, report.checkpoint_fallbacks) == (2, 0)
    assert report.downtime_s == {"n": 2, "p50": 2.0, "p90": 2.4, "max": 2.5}
    assert json.loads(report.to_json())["passed"] is True
    restart = check_run(write_run(tmp_path / "r2", restart_run()))
    assert (restart.switches, restart.checkpoint_fallbacks) == (0, 1)


def _torn(p: Path):
    with open(p / "events.jsonl", "a") as f:
        f.write('{"t": 1, "type": "fau\n')


BAD_INPUT = [
    ("missing summary", lambda p: (p / "summary.json").unlink(), "summary.json"),
    ("missing step log", lambda p: (p / "steps.jsonl").unlink(), "steps.jsonl"),
    ("torn journal line", _torn, "events.jsonl:"),
    ("summary without hashes", lambda p: (p / "summary.json").write_text(json.dumps({"steps": 20})), "summary.json"),
    ("summary not JSON", lambda p: (p / "summary.json").write_text("{"), "summary.json"),
    ("journal is a directory", lambda p: ((p / "events.jsonl").unlink(), (p / "events.jsonl").mkdir()), "events.jsonl"),
    ("not a run directory", lambda p: [f.unlink() for f in p.iterdir()] and p.rmdir(), "run: not a directory"),
]


@pytest.mark.parametrize("spoil,name", [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_names_the_file(tmp_path, capsys, spoil, name):
    path = write_run(tmp_path / "run", switch_run())
    spoil(path)
    with pytest.raises(ChaosInputError, match=name):
        check_run(path)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_cli(tmp_path, capsys):
    good = write_run(tmp_path / "good", switch_run())
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({**RUN, "steps": 20, **H}))
    assert main([str(good), "--reference-summary", str(ref)]) == 0
    out = capsys.readouterr().out
    assert "PASS  commits" in out and "PASS  final_state" in out and "SKIP  processes" in out
    run = switch_run()
    _gap(run)
    bad = write_run(tmp_path / "bad", run)
    assert main([str(bad), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and data["checks"][0]["offending"][0]["problem"] == "gap"


def test_cli_driver_faults_and_pids(tmp_path, capsys):
    run = switch_run()
    _event_without_fault(run)
    path = write_run(tmp_path / "run", run)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"t": T0 + 10.0, "kind": "sigkill_by_driver", "ranks": [1]}]))
    assert main([str(path), "--faults", str(faults), "--pid", str(os.getpid())]) == 1  # this process lives
    out = capsys.readouterr().out
    assert "PASS  faults" in out and "FAIL  processes: checked by pid" in out
    faults.write_text(json.dumps([{"kind": "no time"}]))
    assert main([str(path), "--faults", str(faults)]) == 2
    assert "faults.json" in capsys.readouterr().err


RECORDED = Path(__file__).parent.parent / "fixtures" / "chaos" / "controller-restart"
"""Files of a real local run (dp=2, 60 steps, a drain at step 40) whose controller a driver killed
with SIGKILL after step 14 (faults.json): the supervisor restarted it, it adopted the live processes."""


def test_recorded_controller_restart(tmp_path):
    (driver,) = json.loads((RECORDED / "faults.json").read_text())
    fault = InjectedFault(t=driver["t"], kind=driver["kind"])
    report = check_run(RECORDED, faults=[fault])
    assert report.passed and [c.status for c in report.checks] == ["PASS"] * 4 + ["SKIP"] * 2, report.to_json()
    assert report.events_by_kind == {"controller_restart": 1, "planned": 1}
    alarm = check_run(RECORDED)  # the run cannot see its controller killed: without the driver's fault, a false alarm
    assert [(a["kind"], a["cause"]) for a in alarm.false_alarms] == [
        ("controller_restart", "the controller process died")
    ]
    copy_ = tmp_path / "run"
    copy_.mkdir()
    for name in ("events.jsonl", "summary.json"):
        (copy_ / name).write_text((RECORDED / name).read_text())
    lines = (RECORDED / "steps.jsonl").read_text().splitlines(keepends=True)
    (copy_ / "steps.jsonl").write_text("".join(lines[:15] + lines[14:]))  # step 14 logged twice across the restart
    (bad,) = [c for c in check_run(copy_, faults=[fault]).checks if c.name == "commits"]
    assert bad.status == "FAIL" and bad.offending[0]["step"] == 14


def test_recorded_restart_and_drain(tmp_path):
    """A real local run (dp=2 pp=2, 40 steps): a kill of rank 1 at step 10 before the standby was warm
    (every rank restarted from step 0, 10 steps redone), a drain of rank 2 at step 25 (planned switch)."""
    recorded = RECORDED.parent / "restart-and-drain"
    report = check_run(recorded)
    assert report.passed and [c.status for c in report.checks] == ["PASS"] * 4 + ["SKIP"] * 2, report.to_json()
    assert (report.switches, report.checkpoint_fallbacks, report.faults_by_kind) == (1, 1, {"kill": 1, "drain": 1})
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.jsonl").write_text((recorded / "steps.jsonl").read_text())
    journal = [
        line
        for line in (recorded / "events.jsonl").read_text().splitlines(keepends=True)
        if '"type": "restart"' not in line
    ]
    (run / "events.jsonl").write_text("".join(journal))
    summary = json.loads((recorded / "summary.json").read_text())
    summary["events"][0]["lost_steps"] = 9  # the redo is 10 steps: nothing else allows the tenth
    (run / "summary.json").write_text(json.dumps(summary))
    (bad,) = [c for c in check_run(run).checks if c.name == "commits"]
    assert bad.status == "FAIL" and bad.offending[0]["problem"] == "duplicate", bad.offending


def test_recorded_kill_during_recovery():
    """A real local run (dp=2, 30 steps, a checkpoint every 5): rank 1 killed at step 12, then rank 0,
    the recovery's state source, killed in that recovery; the recovery was dropped (event_cancelled)
    and every rank restarted from checkpoint 10, redoing 10 and 11: one event for two faults."""
    report = check_run(RECORDED.parent / "kill-during-recovery")
    assert report.passed and [c.status for c in report.checks] == ["PASS"] * 4 + ["SKIP"] * 2, report.to_json()
    assert (report.faults_by_kind, report.events_by_kind) == ({"kill": 2}, {"restart": 1})


LOCAL = ["cluster=local", "parallel.dp=2", "parallel.pp=1", "model=tiny", "train.steps=24"]
# The default heartbeat timeout: torch is imported before the hello, and a process still starting is
# allowed runtime.connect_timeout_s (the start-up silence on a loaded host once read as a false alarm).
FAULTS = (
    "standby.count=2",
    "standby.start_when_warm=true",
    "bench.step_delay_s=0.05",
    "faults=[{step:8,kind:kill,rank:1},{step:16,kind:drain,rank:0}]",
)


def _launch(run_dir: Path, *overrides: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tmslurm.cli.launch", f"run_dir={run_dir}", *LOCAL, *overrides]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.dist
def test_real_local_run_with_a_kill_and_a_drain_passes(tmp_path):
    ref = _launch(tmp_path / "ref")  # one after the other: a run of its own takes the 2 CPUs of a laptop
    _launch(tmp_path / "chaos", *FAULTS)
    journal = [json.loads(line) for line in (tmp_path / "chaos" / "events.jsonl").read_text().splitlines()]
    pids = [e["pid"] for e in journal if e["type"] in ("agent_up", "monitor_up")]  # every process is on this host
    pids.append(json.loads((tmp_path / "chaos" / "controller.json").read_text())["pid"])
    report = check_run(tmp_path / "chaos", reference=Summary.parse(ref, "ref"), pids=pids)
    assert report.passed, report.to_json()
    assert all(c.status == "PASS" for c in report.checks), [(c.name, c.status) for c in report.checks]
    assert report.faults_by_kind == {"kill": 1, "drain": 1} and not report.false_alarms
    assert sum(report.events_by_kind.values()) >= 2 and report.downtime_s["n"] >= 2
    broken = copy.deepcopy(ref)
    broken["final_params_sha256"] = "00" * 32
    assert not check_run(tmp_path / "chaos", reference=Summary.parse(broken, "broken")).passed


@pytest.mark.parametrize("pending,status", [(True, "PASS"), (False, "FAIL")])
def test_a_drain_the_run_was_still_waiting_on_is_explained_by_its_pending_notice(tmp_path, pending, status):
    """A driver's drain at the very end of a soak: the run saw the notice but was waiting (for a warm
    standby) when the admin withdrew it; the summary's pending notice is its event. Without it the
    fault has none."""
    run = switch_run()
    if pending:
        run["summary"]["pending_notices"] = [
            {"kind": "maintenance", "node": "n3", "rank": None, "source": "slurm", "reason": "DRAIN", "time": T0 + 18.4}
        ]
    drain = InjectedFault(t=T0 + 18.0, kind="drain", ranks=(3,), nodes=("n3",))
    report = check_run(write_run(tmp_path / "run", run), faults=[drain])
    (faults,) = [c for c in report.checks if c.name == "faults"]
    assert faults.status == status, faults.offending
    assert (report.events_by_kind.get("pending_notice") == 1) is pending
