"""After the controller is lost: which monitor requeues the main job (only one of the main job's,
only for a run that neither finished nor requeued itself), the snapshot that says how far the
lost incarnation got, and how the next incarnation records the loss."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.controller.snapshot import Snapshots, read_snapshot
from tmslurm.core.rundir import RunDir
from tmslurm.slurm.proc.orphan import probe_controller, requeue_orphaned_job


def free_port() -> int:
    """A loopback port with nothing listening (connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    rd = RunDir(tmp_path)
    rd.controller.write_text(
        json.dumps({"host": "127.0.0.1", "port": free_port(), "store_port": 2, "main_job_id": "41", "pid": 1})
    )
    rd.token.write_text("t" * 32)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    return rd


@pytest.fixture
def live_controller(run_dir):
    """A loopback listener that answers every status request, like a live controller."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.makefile().readline()
                conn.sendall(b'{"type": "status", "ok": true, "status": {}}\n')

    threading.Thread(target=serve, daemon=True).start()
    addr = json.loads(run_dir.controller.read_text())
    run_dir.controller.write_text(json.dumps({**addr, "port": server.getsockname()[1]}))
    yield run_dir
    server.close()


@pytest.mark.parametrize(
    "setup,why",
    [
        (lambda rd, mp: mp.setenv("SLURM_JOB_ID", "77"), "a spare job's monitor"),
        (lambda rd, mp: mp.delenv("SLURM_JOB_ID"), "not on Slurm"),
        (lambda rd, mp: rd.summary.write_text("{}"), "the run finished"),
        (lambda rd, mp: rd.requeue.write_text("{}"), "the controller requeued the job itself"),
        (lambda rd, mp: rd.controller_lost.write_text("{}"), "another monitor holds the claim"),
        (lambda rd, mp: rd.controller.write_text("not json"), "controller.json unreadable"),
    ],
)
def test_a_monitor_that_must_not_requeue_does_nothing(run_dir, monkeypatch, setup, why):
    setup(run_dir, monkeypatch)
    before = sorted(os.listdir(run_dir.path))
    assert requeue_orphaned_job(run_dir.path, "node2", "silent", scontrol="/nonexistent/scontrol") is False, why
    assert sorted(os.listdir(run_dir.path)) == before, why


def test_a_controller_that_answers_is_never_requeued(live_controller):
    assert probe_controller(live_controller.path) == "alive"
    assert requeue_orphaned_job(live_controller.path, "node2", "silent", scontrol="/nonexistent/scontrol") is False
    assert not live_controller.controller_lost.exists()


def test_the_first_main_job_monitor_claims_and_records_a_failed_requeue(run_dir):
    assert probe_controller(run_dir.path) == "refused"  # the controller's process is gone
    assert requeue_orphaned_job(run_dir.path, "node2", "silent 5s", scontrol="/nonexistent/scontrol") is False
    claim = json.loads(run_dir.controller_lost.read_text())
    assert claim["node"] == "node2" and claim["why"] == "silent 5s" and claim["requeue_rc"] is None
    assert "nonexistent" in claim["requeue_output"]
    assert requeue_orphaned_job(run_dir.path, "node3", "silent 5s", scontrol="/nonexistent/scontrol") is False
    assert json.loads(run_dir.controller_lost.read_text())["node"] == "node2"  # one claim per loss


def test_the_claim_is_on_disk_before_scontrol_requeue_runs(run_dir, tmp_path):
    """The requeue ends the monitor's own step, often before scontrol returns: what the claim says
    must already be written when scontrol runs (it was written after, and a CI soak found it empty)."""
    seen = tmp_path / "seen-by-scontrol.json"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ncp '{run_dir.controller_lost}' '{seen}'\necho requeued\n")
    scontrol.chmod(0o755)
    assert requeue_orphaned_job(run_dir.path, "node2", "silent 5s", scontrol=str(scontrol)) is True
    early = json.loads(seen.read_text())
    assert early["node"] == "node2" and early["why"] == "silent 5s" and "requeue_rc" not in early
    claim = json.loads(run_dir.controller_lost.read_text())
    assert claim["requeue_rc"] == 0 and claim["requeue_output"] == "requeued" and claim["t"] == early["t"]


@pytest.mark.parametrize("text", ["", '{"node": "node2"', "[1]", '{"t": "soon"}'])
def test_a_claim_cut_off_before_it_was_written_still_records_the_loss(tmp_path, text):
    rd = RunDir(tmp_path)
    rd.controller_lost.write_text(text)
    os.utime(rd.controller_lost, (1000.0, 1000.0))
    rd.snapshot.write_text(json.dumps({"step": 26, "epoch": 0, "t": 990.0, "last_commit_t": 989.5, "fired": []}))
    h = Harness(tmp_path, 2, 2, 1)
    (ev,) = h.ctl.ctx.events.items
    assert ev["kind"] == "controller_lost_requeue" and ev["requeue_t"] == 1000.0 and ev["lost_steps"] == 26
    assert "the claim was cut off" in ev["cause"]
    assert not rd.controller_lost.exists() and list(tmp_path.glob("controller-lost-*.json"))
    (entry,) = h.journal("resumed_after_lost_controller")
    assert entry["redo_steps"] == 26


def test_snapshots_keep_only_the_newest_and_close_writes_the_last(tmp_path):
    snaps = Snapshots(tmp_path / "snapshot.json")
    for step in range(200):
        snaps.offer(step, {"epoch": 0, "t": 1.0, "last_commit_t": 2.0, "fired": []})
    snaps.offer(199, {"epoch": 9})  # same step: ignored
    snaps.close()
    assert read_snapshot(tmp_path / "snapshot.json") == {
        "step": 199,
        "epoch": 0,
        "t": 1.0,
        "last_commit_t": 2.0,
        "fired": [],
    }
    (tmp_path / "snapshot.json").write_text("{torn")
    assert read_snapshot(tmp_path / "snapshot.json") is None


def test_the_next_incarnation_records_the_loss_and_the_steps_it_redoes(tmp_path):
    rd = RunDir(tmp_path)
    rd.controller_lost.write_text(json.dumps({"t": 1000.0, "node": "node2", "why": "silent 5.1s", "requeue_rc": 0}))
    rd.snapshot.write_text(json.dumps({"step": 26, "epoch": 0, "t": 990.0, "last_commit_t": 989.5, "fired": []}))
    rd.events.write_text(json.dumps({"t": 1.0, "type": "fault_firing", "index": 0, "kind": "drain", "rank": 0}) + "\n")
    h = Harness(tmp_path, 2, 2, 1, "faults=[{step:25,kind:drain,rank:0}]")
    (ev,) = h.ctl.ctx.events.items
    assert ev["kind"] == "controller_lost_requeue" and ev["trigger"] == "unexpected"
    assert ev["target_step"] == 26 and ev["from_checkpoint_step"] == 0 and ev["lost_steps"] == 26
    assert "node2" in ev["cause"] and ev["requeue_rc"] == 0
    assert h.state.fired == {0}  # the fault that took the controller's host is not fired again
    assert not rd.controller_lost.exists() and list(tmp_path.glob("controller-lost-*.json"))
    (entry,) = h.journal("resumed_after_lost_controller")
    assert entry["redo_steps"] == 26 and entry["node"] == "node2"


def test_a_snapshot_a_commit_behind_the_step_log_counts_the_steps_the_log_has(tmp_path):
    """The host died between appending step 27 to the step log and replacing the snapshot (26 steps):
    the redo is counted from the log (28 steps), so the step logged twice is an allowed redo."""
    rd = RunDir(tmp_path)
    rd.controller_lost.write_text(json.dumps({"t": 1000.0, "node": "node2", "why": "silent 5.1s", "requeue_rc": 0}))
    rd.snapshot.write_text(json.dumps({"step": 26, "epoch": 0, "t": 990.0, "last_commit_t": 989.5, "fired": []}))
    rd.steps.write_text("".join(json.dumps({"step": s, "t_end": 900.0 + s}) + "\n" for s in range(28)))
    h = Harness(tmp_path, 2, 2, 1)
    (ev,) = h.ctl.ctx.events.items
    assert ev["target_step"] == 28 and ev["lost_steps"] == 28
    (entry,) = h.journal("resumed_after_lost_controller")
    assert entry["redo_steps"] == 28 and entry["last_committed"] == 28


def test_the_next_job_keeps_the_events_and_step_log_of_the_jobs_before(tmp_path):
    """The summary covers the whole run, as after a requeue: the completed events come back from the
    journal, the step log from ``steps.jsonl``. An event the lost job left open is not taken back: it
    never completes, and the loss's own event stands for it."""
    rd = RunDir(tmp_path)
    rd.controller_lost.write_text(json.dumps({"t": 1000.0, "node": "node2", "why": "silent 5.1s", "requeue_rc": 0}))
    rd.snapshot.write_text(json.dumps({"step": 26, "epoch": 3, "t": 990.0, "last_commit_t": 989.5, "fired": []}))
    rd.steps.write_text("".join(json.dumps({"step": s, "t_end": 900.0 + s}) + "\n" for s in range(26)))
    done = {"kind": "unexpected", "epoch": 1, "ranks": [1], "status": "done", "target_step": 9, "lost_steps": 0}
    rd.events.write_text(
        "".join(
            json.dumps(e) + "\n"
            for e in [
                {"t": 950.0, "type": "event", **done},
                {"t": 980.0, "type": "event_begin", "kind": "unexpected", "epoch": 3, "ranks": [0], "status": "open"},
            ]
        )
    )
    h = Harness(tmp_path, 2, 2, 1)
    events = h.ctl.ctx.events.items
    assert [e["kind"] for e in events] == ["unexpected", "controller_lost_requeue"], events
    assert events[0] == done
    assert [e["step"] for e in h.state.step_log] == list(range(26))
