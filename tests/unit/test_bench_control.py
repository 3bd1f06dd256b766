"""The pure parts of ``bench control``: the simulated agent's replies, the records, the figures."""

from __future__ import annotations

import pytest

from benchmarks.common import recorded_command
from benchmarks.control import table
from benchmarks.loadrec import Recorder, key_of
from benchmarks.procstat import parse_stat, percentile, summarize, top_frames
from benchmarks.simagent import Phase, SimAgent
from tmslurm.core.topology import Layout
from tmslurm.wire.messages import (
    Abort,
    Aborted,
    Activate,
    Address,
    Cancel,
    Decision,
    Done,
    Finish,
    Groups,
    Join,
    Joined,
    Left,
    MoveSpec,
    Prepare,
    Prepared,
    Ready,
    Recover,
    Recovered,
    Started,
    Switched,
    SwitchSpec,
    Vote,
    Welcome,
)

LAYOUT = Layout(dp=2, pp=2, n_layer=4)
WELCOME = Welcome(
    config={}, epoch=0, generation=0, resume_step=0, faults=[], address=Address(host="127.0.0.1", port=1, store_port=2)
)


def worker(rank: int) -> SimAgent:
    agent = SimAgent("worker", rank, f"sim{rank}", LAYOUT, "tok")
    agent.on_welcome(WELCOME)
    return agent


def voted(agent: SimAgent) -> Vote:
    (vote,) = agent.vote().send
    assert isinstance(vote, Vote)
    return vote


# ---- the simulated agent ----------------------------------------------------------------------------
def test_worker_starts_votes_and_follows_decisions():
    agent = SimAgent("worker", 3, "sim3", LAYOUT, "tok")
    hello = agent.hello()
    assert (hello.kind, hello.id, hello.token, hello.node) == ("worker", 3, "tok", "sim3")
    reply = agent.on_welcome(WELCOME)
    assert [type(m) for m in reply.send] == [Started, Groups] and reply.vote_after_step
    assert set(reply.send[1].gens) == {"dp/stage1", "pp/replica1/0-1"}  # rank 3 = dp 1, stage 1
    vote = voted(agent)
    assert (vote.step, vote.epoch, vote.rank) == (0, 0, 3)
    assert agent.on_message(Decision(step=5, epoch=0)).send == [] and agent.step == 0  # not its step: ignored
    reply = agent.on_message(Decision(step=0, epoch=0))
    assert reply.vote_after_step and reply.send == [] and agent.step == 1
    assert voted(agent).step == 1


def test_planned_switch_stayer_and_leaver():
    stayer, leaver = worker(3), worker(1)
    for agent in (stayer, leaver):
        (prepared,) = agent.on_message(Prepare(epoch=1, groups={"dp/stage1": 1}, pairs={})).send
        assert isinstance(prepared, Prepared) and (prepared.epoch, prepared.rank) == (1, agent.rank)
        voted(agent)
    decision = Decision(step=0, epoch=1, switch=SwitchSpec(epoch=1, moves=[MoveSpec(rank=1, joiner="standby0.0#5")]))
    reply = stayer.on_message(decision)
    assert [type(m) for m in reply.send] == [Switched] and reply.vote_after_step and stayer.epoch == 1
    reply = leaver.on_message(decision)
    (left,) = reply.send
    assert isinstance(left, Left) and (left.rank, left.step) == (1, 1)
    assert reply.close and reply.give == ("xfer/r1", 1) and not reply.vote_after_step


def test_abort_then_recover_as_a_state_source():
    agent = worker(0)
    voted(agent)
    (aborted,) = agent.on_message(Abort(epoch=2, step=0)).send
    assert isinstance(aborted, Aborted) and (aborted.epoch, aborted.step) == (2, 0)
    assert set(aborted.status) == {"dp/stage0", "pp/replica0/0-1"}
    assert agent.on_message(Abort(epoch=2, step=0)).send == []  # the same abort twice: one answer
    assert agent.on_message(Recover(epoch=1, groups={}, pairs={})).send == []  # not the epoch it aborted in
    reply = agent.on_message(Recover(epoch=2, groups={"dp/stage0": 2}, pairs={"xfer/r2": [2, 0]}))
    assert [type(m) for m in reply.send] == [Recovered, Groups] and reply.send[0].transfer_s == 0.0
    assert reply.barrier == 2 and reply.give == ("xfer/r2", 0) and not reply.vote_after_step
    assert agent.released().vote_after_step and agent.phase is Phase.COMPUTING
    assert (voted(agent).epoch, agent.step) == (2, 0)


def test_standby_planned_join_then_serves_the_rank():
    sb = SimAgent("standby", 0, "spare0", LAYOUT, "tok")
    reply = sb.on_welcome(WELCOME)
    assert sorted(m.role for m in reply.send if isinstance(m, Ready)) == ["first", "last"]
    (prepared,) = sb.on_message(Join(epoch=1, rank=1, groups={"dp/stage1": 1}, xfer="xfer/r1", activate=False)).send
    assert isinstance(prepared, Prepared) and (prepared.joiner, prepared.rank) == (0, 1)
    assert sb.on_message(Activate(epoch=9)).take is None  # another epoch's activate
    assert sb.on_message(Activate(epoch=1)).take == "xfer/r1"
    reply = sb.on_state(7)
    joined = reply.send[0]
    assert isinstance(joined, Joined) and (joined.rank, joined.step, joined.joiner, joined.epoch) == (1, 7, 0, 1)
    assert reply.vote_after_step and reply.barrier is None
    vote = voted(sb)
    assert (vote.rank, vote.step, vote.epoch) == (1, 7, 1)
    assert sb.on_message(Decision(step=7, epoch=1)).vote_after_step


def test_standby_recovery_join_waits_at_the_barrier_and_cancel_returns_to_pool():
    sb = SimAgent("standby", 1, "spare1", LAYOUT, "tok")
    sb.on_welcome(WELCOME)
    assert sb.on_message(Join(epoch=3, rank=2, groups={}, xfer="xfer/r2", activate=True)).take == "xfer/r2"
    reply = sb.on_state(4)
    assert reply.barrier == 3 and not reply.vote_after_step
    other = SimAgent("standby", 2, "spare2", LAYOUT, "tok")
    other.on_welcome(WELCOME)
    other.on_message(Join(epoch=5, rank=0, groups={}, xfer="xfer/r0", activate=False))
    assert other.on_message(Cancel(epoch=5)).send == [] and other.phase is Phase.POOL and other.joining is None


def test_final_decision_done_and_finish():
    agent = worker(2)
    voted(agent)
    (done,) = agent.on_message(Decision(step=0, epoch=0, final=True)).send
    assert isinstance(done, Done) and (done.rank, done.stage, done.shard, done.step) == (2, 0, 0, 1)
    assert done.digest == done.state_digest == "sim0" and agent.phase is Phase.DONE
    assert agent.on_message(Decision(step=1, epoch=0)).send == []  # done: no more steps
    assert agent.on_message(Finish()).close and agent.phase is Phase.CLOSED


def test_replicas_report_equal_digests():
    a, b = worker(0), worker(2)  # both stage 0
    for agent in (a, b):
        voted(agent)
    da = a.on_message(Decision(step=0, epoch=0, final=True)).send[0]
    db = b.on_message(Decision(step=0, epoch=0, final=True)).send[0]
    assert da.digest == db.digest and da.state_digest == db.state_digest


# ---- records and figures ----------------------------------------------------------------------------
def test_recorder_keys_by_step_or_epoch():
    rec = Recorder()
    Recorder.mark(rec.recv, Decision(step=4, epoch=1), 1.0)
    stamp = Recorder.mark(rec.recv, Decision(step=4, epoch=1), 3.0)
    Recorder.mark(rec.recv, Decision(step=4, epoch=1), 2.0)
    assert (stamp.first, stamp.last, stamp.count) == (1.0, 3.0, 3)
    assert key_of(Abort(epoch=2, step=9)) == 2 and key_of(Finish()) == -1
    assert set(rec.recv) == {("decision", 4)}


def test_percentiles():
    xs = [float(x) for x in range(1, 101)]
    assert percentile(xs, 50) == 50.0 and percentile(xs, 99) == 99.0 and percentile(xs, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    s = summarize([3.0, 1.0, 2.0])
    assert (s["p50"], s["max"], s["mean"], s["samples"]) == (2.0, 3.0, 2.0, 3)
    assert summarize([])["p50"] is None


def test_parse_stat_fields():
    line = "1234 (python x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 17 0 100 999 2560 18446744073709551615"
    fields = line[line.rindex(")") + 2 :].split()
    cpu, threads, rss = parse_stat(fields)
    assert threads == 17 and cpu == pytest.approx(300 / __import__("os").sysconf("SC_CLK_TCK"))
    assert rss == pytest.approx(2560 * __import__("os").sysconf("SC_PAGE_SIZE") / 2**20)


def test_top_frames_from_collapsed_stacks(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "run (a/loop.py:10);tick (a/deadlines.py:40);_heartbeats (a/deadlines.py:55) 30\n"
        "run (a/loop.py:10);tick (a/deadlines.py:41) 10\n"
        "_read_agent (a/gate.py:170);recv (a/protocol.py:70) 60\n"
    )
    top = top_frames(raw, n=2)
    assert top["samples"] == 100
    assert top["self"][0] == {"frame": "recv (protocol.py)", "samples": 60, "share": 0.6}
    assert {f["frame"]: f["samples"] for f in top["inclusive"]} == {
        "_read_agent (gate.py)": 60,
        "recv (protocol.py)": 60,
    }
    incl = top_frames(raw, n=10)["inclusive"]
    assert {f["frame"]: f["samples"] for f in incl}["tick (deadlines.py)"] == 40


def test_table_marks_missing_figures_and_failures():
    text = table(
        [
            {"ranks": 64, "commit_p50_ms": 1.5, "reached": "stopped"},
            {"ranks": 4096, "reached": "admitted", "failed": "timed out"},
        ]
    )
    assert "| 64 |" in text and "| 1.5 |" in text and "- |" in text
    assert "N=4096: failed after 'admitted': timed out" in text


@pytest.mark.parametrize(
    "argv,recorded",
    [
        (["--sizes", "64", "256"], "python -m benchmarks control --sizes 64 256"),
        (
            ["--out", "/scratch/x", "--json", "/scratch/y.json", "--label", "a b"],
            "python -m benchmarks control --out <scratch dir> --json <scratch file> --label a b",
        ),
        (
            ["--json", "docs/bench/control_scale.json"],
            "python -m benchmarks control --json docs/bench/control_scale.json",
        ),
    ],
)
def test_recorded_commands_name_no_machine_path(argv, recorded):
    assert recorded_command("control", argv) == recorded
