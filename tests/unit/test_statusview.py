"""``tmslurm status`` views (:mod:`tmslurm.cli.status_view`, :mod:`tmslurm.cli.run_status`): the compact watch view,
standby warmth, steps/s, the watch loop on a terminal and on a pipe, an unreachable controller,
the end of the run and Ctrl-C; and the view of a real controller's status reply."""

from __future__ import annotations

import io
import json

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.cli.run_status import RunEnding, RunStatus, StandbyView, fetch, from_summary
from tmslurm.cli.status_view import CLEAR, RateMeter, Watch, _warmth, format_status, format_watch
from tmslurm.core.errors import AuthError, TmslurmError
from tmslurm.core.results import Summary

SUMMARY = {
    "run_id": "r",
    "layout": {"dp": 2, "pp": 1},
    "steps": 24,
    "final_params_sha256": None,
    "final_state_sha256": None,
    "loss_last": 1.5,
    "events": [],
}


def _status(**over) -> dict:
    st = {
        "run_dir": "runs/demo",
        "mode": "running",
        "step": 30,
        "steps": 900,
        "step_time_s": 0.25,
        "loss": 3.28934,
        "shape_classes": ["first", "last"],
        "ranks": [
            {"rank": 0, "node": "node1", "role": "first", "agent": "w0", "alive": True},
            {"rank": 1, "node": "node1", "role": "last", "agent": "w1", "alive": True},
            {"rank": 2, "node": "node3", "role": "first", "agent": "w2", "alive": False},
            {"rank": 3, "node": None, "role": "last", "agent": None, "alive": False},
        ],
        "standbys": [
            {"id": "standby0.1", "node": "node5", "roles": ["first", "last"], "busy": False},
            {"id": "standby1.2", "node": "node6", "roles": ["first"], "busy": True},
        ],
        "events": [
            {"kind": "planned", "ranks": [k], "node": f"node{k}", "downtime_s": 0.1 * k, "detect_s": 0.05}
            for k in range(7)
        ],
        "main_job_id": "65",
        "spare_job_ids": ["66", "67"],
        "incarnation": 1,
    }
    return {**st, **over}


def test_the_watch_view_shows_step_rate_ranks_standbys_events_and_jobs():
    text = format_watch(RunStatus.from_dict(_status()), 4.0, 0.0)
    lines = text.splitlines()
    assert lines[0].startswith("run runs/demo  running  step 30/900  4.00 steps/s  loss 3.2893  [")
    assert lines[1] == "jobs: main 65 (incarnation 1)  spares 66, 67"
    assert (
        "  node1          0 up, 1 up" in lines
        and "  node3          2 dead" in lines
        and "  -              3 none" in lines
    )
    assert "  standby0.1         node5          warm 2/2 (first, last)" in lines
    assert "  standby1.2         node6          joining, warming 1/2 (first)" in lines
    assert "events (5 of 7):" in lines
    assert lines[-1] == "  planned ranks=[6] node=node6 downtime=0.600s detect=0.050s"  # the last event last
    assert "ranks=[1]" not in text  # older events left out


@pytest.mark.parametrize(
    "over, expect",
    [
        ({"main_job_id": None, "spare_job_ids": []}, "jobs: - (not on Slurm)"),
        ({"ranks": [], "standbys": [], "events": []}, "ranks:\n  -\nstandbys:\n  -\nevents:\n  -"),
        ({"step": None, "steps": None, "loss": None}, "step ?/?  loss ?"),
    ],
)
def test_the_watch_view_of_partial_statuses(over, expect):
    rate = None if over.get("step", 1) is None else 1.0
    assert expect in format_watch(RunStatus.from_dict(_status(**over)), rate, 0.0)


@pytest.mark.parametrize(
    "warm, joining, classes, expect",
    [
        (("first", "last"), False, ("first", "last"), "warm 2/2 (first, last)"),
        (("first",), False, ("first", "middle", "last"), "warming 1/3 (first)"),
        ((), False, ("first", "last"), "cold 0/2"),
        (("only",), True, ("only",), "joining, warm 1/1 (only)"),
        (("first", "last"), False, (), "warm: first, last"),  # a source that does not list the classes
        ((), False, (), "cold"),
    ],
)
def test_standby_warmth(warm, joining, classes, expect):
    assert _warmth(StandbyView("s0", "n1", warm, joining), classes) == expect


def test_the_one_shot_listing_keeps_its_format():
    text = format_status(RunStatus.from_dict(_status(events=_status()["events"][:1])))
    assert text.splitlines() == [
        "run runs/demo  mode=running  step=30/900  step_time=0.250s  loss=3.2893",
        "main job 65 (incarnation 1)  spares 66, 67",
        "  rank   0  first   node node1",
        "  rank   1  last    node node1",
        "  rank   2  first   node node3  (dead)",
        "  rank   3  last    node None  (no agent)",
        "  standby standby0.1  node node5  warm roles: first, last",
        "  standby standby1.2  node node6  warm roles: first",
        "  event planned ranks=[0] node=node0 downtime=0.000s detect=0.050s",
    ]


def test_a_summary_reads_as_a_finished_status():
    summary = Summary.parse(
        {
            "run_id": "r",
            "layout": {"dp": 2, "pp": 1},
            "steps": 20,
            "final_params_sha256": "ab" * 32,
            "final_state_sha256": "cd" * 32,
            "loss_last": 3.0,
            "median_step_s": 0.5,
            "events": [],
            "standbys": [{"id": "s0", "node": "n", "roles": {"last": {}, "first": {}}}],
        },
        "test summary",
    )
    st = RunStatus.from_dict(from_summary(summary))
    assert st.finished and st.step == 20 and st.loss == 3.0 and st.step_time_s == 0.5
    assert st.standbys[0].warm == ("first", "last") and st.ranks == []


@pytest.mark.parametrize(
    "samples, expect",
    [
        ([(0.0, 10)], None),  # one sample: not measured (never 1 / step time)
        ([(0.0, 10), (2.0, 20)], 5.0),  # step delta / time delta
        ([(0.0, 10), (2.0, 10)], 0.0),  # stalled
        ([(0.0, 10), (2.0, 20), (4.0, 40)], 7.5),  # across the window
        ([(0.0, 0), (10.0, 10), (20.0, 40), (22.0, 44)], 2.0),  # samples older than 10 s dropped
        ([(0.0, 0), (30.0, 30)], 1.0),  # the previous sample is kept however old
        ([(0.0, 50), (2.0, 60), (4.0, 40)], None),  # back to a checkpoint: starts again, one sample
        ([(0.0, 50), (2.0, 60), (4.0, 40), (6.0, 44)], 2.0),
        ([(0.0, 10), (0.0, 12)], None),  # no time passed
        ([(0.0, None)], None),
    ],
)
def test_steps_per_second(samples, expect):
    meter = RateMeter(window_s=10.0)
    rates = [meter.add(t, step) for t, step in samples]
    assert rates[-1] == (None if expect is None else pytest.approx(expect))


class Script:
    """A fetch that plays a list of statuses (dicts) and exceptions, and a sleep that counts."""

    def __init__(self, *items) -> None:
        self.items = list(items)
        self.sleeps = 0
        self.t = 0.0

    def fetch(self) -> RunStatus:
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return RunStatus.from_dict(item)

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.t += s


def _watch(script: Script, tty: bool) -> tuple[Watch, io.StringIO]:
    out = io.StringIO()
    return Watch(
        script.fetch, out, interval_s=2.0, tty=tty, clock=lambda: script.t, wall=lambda: 0.0, sleep=script.sleep
    ), out


@pytest.mark.parametrize("tty", [True, False])
def test_watch_refreshes_until_the_run_finishes(tty):
    script = Script(_status(step=10), _status(step=20), _status(step=24, mode="finished"))
    watch, out = _watch(script, tty)
    assert watch.run() == 0 and script.sleeps == 2 and not script.items
    text = out.getvalue()
    assert (
        text.count("run runs/demo") == 3 and "step 20/900  5.00 steps/s" in text and "step 24/900  3.50 steps/s" in text
    )
    if tty:
        assert text.count(CLEAR) == 3 and text.startswith(CLEAR)
    else:
        assert "\x1b" not in text and text.count("\n\nrun runs/demo") == 2  # plain blocks, a blank line between


def test_an_unreachable_controller_is_shown_and_retried():
    gone = TmslurmError("controller at h:1 is unreachable: [Errno 111] Connection refused. Is the run still alive?")
    script = Script(gone, _status(step=10), OSError("timed out"), _status(mode="finished"))
    watch, out = _watch(script, tty=False)
    assert watch.run() == 0 and not script.items
    blocks = out.getvalue().split("\n\n")
    assert blocks[0] == f"controller unreachable: {gone}, retrying every 2s"
    assert blocks[2].startswith(
        "controller unreachable: timed out, retrying every 2s\nrun runs/demo  running  step 10/900"
    )


def test_a_run_that_is_ending_is_waited_for(tmp_path, monkeypatch):
    """The controller closes requests just before it writes summary.json (found on the lab): fetch waits
    for the summary; without one in time it raises RunEnding, which the watch retries."""
    ending = {"type": "error", "error": "the run has finished; it takes no more requests", "ending": True}
    monkeypatch.setattr("tmslurm.wire.protocol.request", lambda *a, **k: ending)
    (tmp_path / "controller.json").write_text("{}")  # the live controller advertised itself
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s
        if t[0] >= 0.3:
            (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))

    st = fetch(tmp_path, None, timeout_s=5, clock=lambda: t[0], sleep=sleep)
    assert st["mode"] == "finished" and st["step"] == 24
    (tmp_path / "summary.json").unlink()
    with pytest.raises(RunEnding, match="no summary.json yet"):
        fetch(tmp_path, None, timeout_s=0.2, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    monkeypatch.setattr("tmslurm.wire.protocol.request", lambda *a, **k: {**ending, "ending": False})
    with pytest.raises(TmslurmError, match="refused the status request") as err:
        fetch(tmp_path, None, timeout_s=0.2)
    assert not isinstance(err.value, RunEnding)
    script = Script(_status(step=10), RunEnding("the run has finished; no summary.json yet"), _status(mode="finished"))
    watch, out = _watch(script, tty=False)
    assert watch.run() == 0 and "controller unreachable: the run has finished" in out.getvalue()


def test_a_refusal_is_not_retried():
    watch, _ = _watch(Script(AuthError("the controller refused the status request: bad token")), tty=False)
    with pytest.raises(AuthError):
        watch.run()


def test_ctrl_c_ends_the_watch_with_0():
    script = Script(_status(), KeyboardInterrupt())
    watch, out = _watch(script, tty=True)
    assert watch.run() == 0 and out.getvalue().endswith("\n\n")


def test_a_bad_interval_is_refused():
    with pytest.raises(TmslurmError, match="--interval must be > 0"):
        Watch(lambda: None, io.StringIO(), interval_s=0, tty=False)


def test_the_view_of_a_real_controller_status(tmp_path):
    h = Harness(tmp_path, 2, 2, 1)
    h.commit_all()
    h.disconnect(1)
    raw = h.ctl.summary.status()
    assert (
        raw["shape_classes"] == ["first", "last"] and [r["shape_class"] for r in raw["ranks"]] == ["first", "last"] * 2
    )
    lines = format_watch(RunStatus.from_dict(raw), None, 0.0).splitlines()
    assert "  n0             0 up" in lines and "  n2             2 up" in lines
    assert any(line.startswith("  n1             1 ") and not line.endswith(" up") for line in lines), lines
    assert any(line.endswith("warm 2/2 (first, last)") for line in lines), lines


def test_a_fast_compute_step_in_a_slow_run_shows_the_measured_rate():
    """The run makes 2 steps/s while each step computes in 1/16.5 s: the view says 2.00, never 16.50."""
    script = Script(_status(step=10, step_time_s=1 / 16.5), _status(step=14, step_time_s=1 / 16.5, mode="finished"))
    watch, out = _watch(script, tty=False)
    assert watch.run() == 0
    first, second = out.getvalue().split("\n\n")[:2]
    assert "steps/s" not in first and "16.50" not in out.getvalue()
    assert "step 14/900  2.00 steps/s" in second


@pytest.mark.parametrize(
    "event, line",
    [
        ({"kind": "requeue", "ranks": [], "node": None, "downtime_s": None}, "requeue"),
        ({"kind": "requeue", "downtime_s": 12.5}, "requeue downtime=12.500s"),
        (
            {"kind": "failure", "ranks": [2], "node": "n3", "downtime_s": None, "detect_s": 0.5},
            "failure ranks=[2] node=n3 detect=0.500s",
        ),
    ],
)
def test_event_lines_leave_out_empty_fields(event, line):
    text = format_watch(RunStatus.from_dict(_status(events=[event])), None, 0.0)
    assert text.splitlines()[-1] == f"  {line}"
    assert "ranks=[]" not in text and "node=None" not in text and "node= " not in text
