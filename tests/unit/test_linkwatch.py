"""Gray links (tmslurm.controller.linkwatch): which node's link is judged slow from probe
throughputs alone, how rounds pair the nodes, and what the controller does about a slow one
(fake channels and a fake clock, no process)."""

from __future__ import annotations

import pytest

from tests.unit.controller_harness import Harness
from tests.unit.test_gray import _notices
from tests.unit.test_monitors import add_monitor
from tmslurm.controller.items import MessageIn
from tmslurm.controller.linkwatch import SETTLE_STEPS, LinkSettings, LinkWatch
from tmslurm.wire.messages import Probed, SinkAt

S = LinkSettings(factor=4.0, window=4)
NODES = ["a", "b", "c", "d", "e", "f"]
FAST, SLOW = 400.0, 2.5  # MB/s: a veth on this host, and 20 mbit/s


def _rounds(
    n: int, slow: dict[str, int] | None = None, watch: LinkWatch | None = None, hiccup: tuple[int, str] | None = None
) -> tuple[LinkWatch, dict[int, list[str]]]:
    """``n`` rounds over NODES; ``slow[node] = round`` from which its link is slow; ``hiccup``: one
    slow probe sent by that node in that round. Returns the watch and {round: nodes found}."""
    watch = watch or LinkWatch(S)
    found: dict[int, list[str]] = {}
    for r in range(n):
        for sender, sink in LinkWatch.pairs(NODES, r):
            bad = any(node in (sender, sink) and r >= start for node, start in (slow or {}).items())
            watch.add(sender, sink, SLOW if bad or hiccup == (r, sender) else FAST)
            got = [s.node for s in watch.judge()]
            if got:
                found.setdefault(r, []).extend(got)
    return watch, found


def test_each_round_every_node_sends_once_and_receives_once_from_a_new_partner():
    seen: dict[str, set[str]] = {n: set() for n in NODES}
    for r in range(len(NODES) - 1):
        pairs = LinkWatch.pairs(NODES, r)
        assert sorted(s for s, _ in pairs) == NODES and sorted(t for _, t in pairs) == NODES
        assert all(s != t for s, t in pairs)
        for s, t in pairs:
            seen[s].add(t)
    assert all(seen[n] == set(NODES) - {n} for n in NODES)  # every partner within n - 1 rounds
    assert LinkWatch.pairs(["a"], 0) == [] and LinkWatch.pairs([], 3) == []


@pytest.mark.parametrize(
    "slow, hiccup, found",
    [
        pytest.param({}, None, {}, id="healthy: nobody"),
        pytest.param({"c": 0}, None, {1: ["c"]}, id="slow from the start: found after two rounds (4 probes)"),
        pytest.param({"c": 3}, None, {4: ["c"]}, id="slow from round 3: found when its window is all slow"),
        pytest.param({}, (2, "b"), {}, id="one slow probe: nobody (the best of the window is fast)"),
        pytest.param({"a": 0, "b": 0, "c": 0}, None, {}, id="half of the nodes slow together: nobody"),
        pytest.param({"a": 0, "d": 0}, None, {1: ["a", "d"]}, id="two slow nodes of six: both"),
    ],
)
def test_which_node_is_found_slow_and_when(slow, hiccup, found):
    assert _rounds(8, slow, hiccup=hiccup)[1] == found


def test_a_healthy_node_paired_with_the_slow_one_is_never_found():
    watch, found = _rounds(20, {"d": 0})
    assert found == {1: ["d"]}  # reported once while it stays slow
    best = watch.best()
    assert best["d"] == SLOW and all(best[n] == FAST for n in NODES if n != "d")


def test_fewer_than_three_nodes_judge_nobody_and_a_node_fast_again_may_be_reported_again():
    w = LinkWatch(S)
    for _ in range(4):
        w.add("a", "b", SLOW)
        w.add("b", "a", SLOW)
    assert w.judge() == []
    watch, found = _rounds(4, {"e": 0})
    assert found == {1: ["e"]}
    _, again = _rounds(4, {}, watch=watch)  # e recovers: nothing is reported
    assert again == {}
    _, third = _rounds(4, {"e": 0}, watch=watch)
    assert list(third.values()) == [["e"]]


# ---- the controller's side --------------------------------------------------------------------
def _harness(tmp_path, standbys: int = 1) -> tuple[Harness, dict[str, tuple[int, object]]]:
    h = Harness(tmp_path, 2, 2, standbys, "gray.evict=true", "gray.link_probe_s=1.0", "gray.link_window=2")
    mons = {}
    for node in ["n0", "n1", "n2", "n3"] + [f"s{i}" for i in range(standbys)]:
        conn, ch = add_monitor(h, node)
        h.ctl.handle(MessageIn(conn, SinkAt(host=f"10.0.0.{len(mons) + 1}", port=9000)))
        mons[node] = (conn, ch)
    h.ctl.monitors.tick(999.0)  # epoch 0 seen: steady once SETTLE_STEPS steps are committed
    for _ in range(SETTLE_STEPS):
        h.commit_all()
    return h, mons


def _round(h: Harness, mons, now_m: float, seconds: dict[str, float | None]) -> None:
    """One round at ``now_m``: every probe sent is answered, its sender's entry of ``seconds``
    (None: timed out) or 0.005 s (2 MiB at 400 MB/s)."""
    h.ctl.monitors.tick(now_m)
    for node, (conn, ch) in mons.items():
        for msg in [m for m in ch.sent if m["type"] == "probe" and not m.get("_answered")]:
            msg["_answered"] = True
            sec = seconds.get(node, 0.005)
            h.ctl.handle(MessageIn(conn, Probed(seq=msg["seq"], seconds=sec, timed_out=sec is None)))


def test_a_slow_link_has_its_nodes_ranks_noticed_for_maintenance(tmp_path):
    h, mons = _harness(tmp_path)
    probes = {n: [m for m in ch.sent if m["type"] == "probe"] for n, (_, ch) in mons.items()}
    assert probes == {n: [] for n in mons}  # none before the first tick
    t = 1000.0
    for i in range(3):
        _round(h, mons, t + i, {"n2": 0.9})  # n2 sends slowly; its sinks' samples with it are slow too
    sent = [m for _, ch in mons.values() for m in ch.sent if m["type"] == "probe"]
    assert len(sent) == 15 and all(m["nbytes"] == 2097152 and m["port"] == 9000 for m in sent)
    (ev,) = h.journal("gray_evict")
    assert ev["node"] == "n2" and ev["cause"] == "link" and ev["best_mbps"] < ev["median_mbps"] / 4, ev
    (n,) = _notices(h)
    assert (n.kind, n.rank, n.source) == ("maintenance", 2, "controller") and "link moved at most" in n.reason
    assert h.cluster.lost == ["n2"]
    _round(h, mons, t + 3, {})
    assert not [m for m in mons["n2"][1].sent if m["type"] == "probe" and m["seq"] > 15]  # moved off: no longer probed


def test_answers_that_match_no_request_change_nothing_and_a_timeout_is_a_slow_sample(tmp_path):
    h, mons = _harness(tmp_path)
    conn, ch = mons["n0"]
    h.ctl.monitors.tick(1000.0)
    (req,) = [m for m in ch.sent if m["type"] == "probe"]
    other = mons["n1"][0]
    h.ctl.handle(MessageIn(other, Probed(seq=req["seq"], seconds=0.001)))  # another monitor answers n0's
    h.ctl.handle(MessageIn(conn, Probed(seq=9999, seconds=0.001)))  # a seq never sent
    links = h.ctl.monitors.links
    assert links.watch.samples == {} and req["seq"] in links.pending
    h.ctl.handle(MessageIn(conn, Probed(seq=req["seq"], error="ConnectionRefusedError")))
    assert links.watch.samples == {} and links.failed == 1  # a refused probe is not a slow one
    h.ctl.monitors.tick(1001.0)
    (req2,) = [m for m in ch.sent if m["type"] == "probe" and m["seq"] != req["seq"]]
    h.ctl.handle(MessageIn(conn, Probed(seq=req2["seq"], timed_out=True, error="ProbeTimeout")))
    (sample,) = links.watch.samples["n0"]
    assert sample[1] == pytest.approx(2097152 / 10.0 / 1e6)


def test_a_slow_node_without_a_standby_to_take_it_is_kept_and_said_once(tmp_path):
    h, mons = _harness(tmp_path, standbys=0)
    for i in range(5):
        _round(h, mons, 1000.0 + i, {"n1": None})
    assert h.journal("gray_evict") == [] and _notices(h) == []
    (kept,) = h.journal("link_slow")
    assert kept["node"] == "n1" and kept["kept"] == "no idle standby"


def test_a_monitor_that_goes_away_is_forgotten(tmp_path):
    h, mons = _harness(tmp_path)
    _round(h, mons, 1000.0, {})
    assert "n3" in h.ctl.monitors.links.watch.samples
    from tmslurm.controller.items import Disconnected

    h.ctl.handle(Disconnected(mons["n3"][0]))
    links = h.ctl.monitors.links
    assert "n3" not in links.sinks and "n3" not in links.watch.samples


def test_links_are_probed_only_while_the_run_is_steady_and_a_change_of_epoch_starts_every_window_over(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "gray.evict=true", "gray.link_probe_s=1.0", "gray.link_window=2")
    mons = {}
    for node in ["n0", "n1", "n2", "n3", "s0"]:
        conn, ch = add_monitor(h, node)
        h.ctl.handle(MessageIn(conn, SinkAt(host="10.0.0.1", port=9000)))
        mons[node] = (conn, ch)
    probes = lambda: [m for _, ch in mons.values() for m in ch.sent if m["type"] == "probe"]  # noqa: E731
    for i in range(SETTLE_STEPS):  # starting processes starve the monitors: no probe yet
        h.ctl.monitors.tick(1000.0 + i)
        assert probes() == []
        h.commit_all()
    _round(h, mons, 1010.0, {})
    links = h.ctl.monitors.links
    assert len(probes()) == 5 and all(len(d) == 2 for d in links.watch.samples.values())
    h.ctl.monitors.tick(1011.0)
    (late,) = [m for m in mons["n0"][1].sent if m["type"] == "probe" and not m.get("_answered")]
    h.state.epoch += 1  # a switch or a recovery: who holds the slots changed
    h.ctl.handle(MessageIn(mons["n0"][0], Probed(seq=late["seq"], seconds=0.9)))  # sent in the old epoch
    assert links.watch.samples == {}
    sent = len(probes())
    h.ctl.monitors.tick(1020.0)
    assert len(probes()) == sent  # not steady again until SETTLE_STEPS more steps
