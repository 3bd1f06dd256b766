"""The controller's side of node relays, with fake channels: a node's votes by column count exactly as
the same votes one by one, only for the slots their connections own; a decision goes to each relay
as one frame."""

from __future__ import annotations

import json

from tests.unit.controller_harness import FakeRelay, Harness
from tmslurm.controller.items import HelloIn, VotesIn
from tmslurm.wire.messages import Hello, NodeVotes
from tmslurm.wire.mux import SubChannel, parse_down


def node_votes(h: Harness, ranks: list[int], loss: float = 1.0) -> NodeVotes:
    n = len(ranks)
    return NodeVotes(
        type="votes",
        step=h.state.step,
        epoch=h.state.epoch,
        rank=ranks,
        loss=[loss + r for r in ranks],
        dt=[0.01 * (r + 1) for r in ranks],
        peak_rss_mb=[1.0] * n,
        digest=[None] * n,
        busy=[0.005] * n,
        ckpt=[None] * n,
    )


def test_node_votes_commit_as_the_same_votes_one_by_one(tmp_path):
    one, many = Harness(tmp_path / "a"), Harness(tmp_path / "b")
    for r in range(one.world):
        one.send(
            r,
            {
                "type": "vote",
                "step": 0,
                "epoch": 0,
                "rank": r,
                "loss": 1.0 + r,
                "dt": 0.01 * (r + 1),
                "peak_rss_mb": 1.0,
            },
        )
    many.ctl.handle(VotesIn([many.conns[r] for r in (0, 1)], node_votes(many, [0, 1])))
    assert many.got(0, "decision") == []  # half the world voted
    many.ctl.handle(VotesIn([many.conns[r] for r in (2, 3)], node_votes(many, [2, 3])))
    assert many.got(3, "decision") == one.got(3, "decision") != []
    timed = ("t_end", "commit_s")  # wall-clock readings of the two controllers
    strip = [{k: v for k, v in e.items() if k not in timed} for e in many.state.step_log]
    assert strip == [{k: v for k, v in e.items() if k not in timed} for e in one.state.step_log]
    assert all(e["commit_s"] >= 0 for e in one.state.step_log + many.state.step_log)


def test_a_row_counts_only_for_the_slot_its_connection_owns(tmp_path):
    h = Harness(tmp_path)
    h.ctl.handle(VotesIn([h.conns[1], h.conns[0], 0, h.conns[3]], node_votes(h, [0, 1, 2, 3])))
    assert set(h.state.votes) == {3}  # rows 0 and 1 came over each other's connection; row 2's agent was refused
    for r in (0, 1, 2):
        h.vote(r)
    assert h.got(0, "decision")[-1]["step"] == 0


class RelayedHarness(Harness):
    """Ranks 2 and 3 say hello through one relay, as its subs 1 and 2."""

    relay = FakeRelay()

    def hello(self, who, kind, ident, node, pid=4242):
        if who not in (2, 3):
            return super().hello(who, kind, ident, node, pid)
        conn = len(self.conns) + 1
        self.conns[who] = conn
        ch = SubChannel(self.relay, who - 1)  # type: ignore[arg-type]
        self.ctl.handle(HelloIn(Hello(type="hello", token="t", kind=kind, id=ident, pid=pid, node=node), conn, ch))
        return ch


def test_a_decision_goes_to_a_relay_as_one_frame(tmp_path):
    h = RelayedHarness(tmp_path)
    h.relay.lines.clear()
    for r in range(h.world):
        h.vote(r)
    (frame,) = [parse_down(x) for x in h.relay.lines if b'"decision"' in x]
    assert frame.subs == (1, 2)
    assert json.loads(frame.line) == h.got(0, "decision")[-1]
