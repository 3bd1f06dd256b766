"""The controller's queue items (:mod:`tmslurm.controller.items`): every kind has its handler in the
dispatch table, each is handled without a handler error, and a failing handler is journalled (a
failing request is answered with an ``error`` and closed)."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller_harness import FakeChannel, Harness
from tmslurm.controller.items import (
    ITEM_TYPES,
    Batch,
    Disconnected,
    FaultAt,
    HelloIn,
    MessageIn,
    NoticeIn,
    Released,
    RequestIn,
    VotesIn,
)
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import FaultSpec, Hello, NodeVotes, StatusRequest, decode_agent

SAMPLES = {
    HelloIn: lambda h: HelloIn(
        Hello(type="hello", token="t", kind="monitor", id=0, pid=7, node="n1"), 900, FakeChannel()
    ),
    RequestIn: lambda h: RequestIn(StatusRequest(type="status", token="t"), FakeChannel()),
    MessageIn: lambda h: MessageIn(
        h.conns[0],
        decode_agent({"type": "groups", "rank": 0, "step": 0, "epoch": 0, "ids": {}, "gens": {}, "peak_rss_mb": 1.0}),
    ),
    Disconnected: lambda h: Disconnected(h.conns["s0"]),
    VotesIn: lambda h: VotesIn(
        [h.conns[0], h.conns[1]],
        NodeVotes(
            type="votes",
            step=0,
            epoch=0,
            rank=[0, 1],
            loss=[1.0, 1.0],
            dt=[0.01, 0.01],
            peak_rss_mb=[1.0, 1.0],
            digest=[None, None],
            busy=[None, None],
            ckpt=[None, 0.25],
        ),
    ),
    NoticeIn: lambda h: NoticeIn(Notice(kind="maintenance", rank=1, source="fault", reason="test", time=time.time())),
    FaultAt: lambda h: FaultAt(
        FaultSpec(index=0, step=1, kind="power_off", rank=2, ranks=[2], amount="", when="midstep"), ("n2",), time.time()
    ),
    Released: lambda h: Released("n3"),
    Batch: lambda h: Batch([Released("n3"), Disconnected(h.conns["s0"])]),
}


def test_the_dispatch_table_covers_every_kind_of_item_and_nothing_else(tmp_path):
    h = Harness(tmp_path)
    assert set(h.ctl.dispatch.item_handlers) == set(ITEM_TYPES) == set(SAMPLES)
    assert len({t.label for t in ITEM_TYPES}) == len(ITEM_TYPES)


@pytest.mark.parametrize("kind", ITEM_TYPES, ids=lambda t: t.__name__)
def test_every_kind_of_item_is_handled_by_its_handler(tmp_path, kind, monkeypatch):
    h = Harness(tmp_path)
    item = SAMPLES[kind](h)
    called = []
    handler = h.ctl.dispatch.item_handlers[kind]
    monkeypatch.setitem(h.ctl.dispatch.item_handlers, kind, lambda it: (called.append(it), handler(it)))
    h.ctl.handle(item)
    assert called[0] is item and not h.journal("handler_error")


def test_what_each_item_does(tmp_path):
    h = Harness(tmp_path)
    mon = FakeChannel()
    h.ctl.handle(HelloIn(Hello(type="hello", token="t", kind="monitor", id=0, pid=7, node="n1"), 900, mon))
    assert h.ctl.monitors.owns(900) and mon.sent[0]["type"] == "welcome"
    ch = FakeChannel()
    h.ctl.handle(RequestIn(StatusRequest(type="status", token="t"), ch))
    assert ch.sent[0]["type"] == "status" and ch.closed
    h.ctl.handle(Released("n3"))
    assert [e["node"] for e in h.journal("node_released")] == ["n3"]
    h.ctl.handle(
        FaultAt(
            FaultSpec(index=0, step=1, kind="power_off", rank=2, ranks=[2], amount="", when="midstep"), ("n2",), 12.5
        )
    )
    assert (
        h.journal("fault")[-1].items()
        >= {"kind": "power_off", "rank": 2, "node": "n2", "ranks": [2], "at": 12.5}.items()
    )
    assert h.state.fault_t == {2: 12.5}
    h.ctl.handle(Disconnected(900))  # a monitor's connection goes to the node watch, not to recoveries
    assert h.state.plan is None


def test_a_failing_request_is_journalled_and_answered(tmp_path, monkeypatch):
    h = Harness(tmp_path)

    def broken(msg, ch):
        raise RuntimeError("boom")

    monkeypatch.setattr(h.ctl.intake, "request", broken)
    ch = FakeChannel()
    h.ctl.handle(RequestIn(StatusRequest(type="status", token="t"), ch))
    assert (
        ch.sent == [{"type": "error", "error": "internal error: RuntimeError('boom')", "ending": False}] and ch.closed
    )
    assert [(e["item"], "boom" in e["error"]) for e in h.journal("handler_error")] == [("request", True)]
