"""Gray links: a node whose link moves bytes far slower than its peers' is found and moved off.

A slow link slows every rank that talks over it alike (everyone waits at the same collective), so
busy times (:mod:`tmslurm.controller.gray`) cannot tell whose link it is. The node monitors measure
the links instead: every ``gray.link_probe_s`` each monitor sends ``gray.link_probe_bytes``
to another monitor's sink (:mod:`tmslurm.agent.linkprobe`) and reports how long it took.

Contract:
- :class:`LinkWatch` (pure) keeps each node's last ``window`` probe throughputs, as sender or as
  sink: a probe crosses both ends' links, so a slow sample may be either end's fault. A node is
  *slow* when even its best sample of a full window (at least two distinct partners) is
  ``factor`` times below the median of the nodes' best: one slow partner, or one hiccup, cannot
  make a healthy node look slow, since its best sample is with another partner. Fewer than three
  judged nodes, or half of them slow together, judge nobody. A node is reported once until it
  recovers (its best sample is fast again) or is forgotten.
- :meth:`LinkWatch.pairs` pairs the nodes for one round: node i sends to node i+k, with k turning
  every round, so each node sends one probe and receives one, each round from other partners.
- :class:`LinkProbes` (on the controller's thread) sends each round's :class:`ProbeLink` to the
  monitors only while the run is steady (running, no plan in flight, at least
  :data:`SETTLE_STEPS` steps committed since the last change of epoch, whose start clears every
  window: starting and warming processes starve the monitors of CPU on a small host, and a probe
  then measures the CPU, not the link), matches each :class:`Probed` to its request (an unknown or foreign ``seq``
  changes nothing), turns a timed-out probe into a sample of at most ``nbytes / timeout``, and hands a slow node to
  :meth:`GrayEvictions.move_off`, which moves its ranks to warm standbys or journals why not (``gray_suspect``). A node
  without ranks (a spare's) is journalled (``link_slow``) and left. Nothing here raises.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tmslurm.controller.context import Context
from tmslurm.controller.state import Mode
from tmslurm.core.config import GrayConfig
from tmslurm.wire.messages import Probed, ProbeLink, SinkAt
from tmslurm.wire.protocol import LineChannel

log = logging.getLogger(__name__)
SETTLE_STEPS = 3
"""Steps committed after a change of epoch (or the start) before links are probed again."""


@dataclass(frozen=True, kw_only=True)
class LinkSettings:
    factor: float
    """A node is slow when its best probe is this many times below the median of the nodes' best."""
    window: int
    """Probes per node judged (sent or received): the best of them must be slow."""


@dataclass(frozen=True)
class SlowLink:
    node: str
    best_mbps: float
    """The node's best probe throughput over its window (MB/s)."""
    median_mbps: float
    """The median of every judged node's best (MB/s)."""


class LinkWatch:
    def __init__(self, settings: LinkSettings) -> None:
        self.s = settings
        self.samples: dict[str, deque[tuple[str, float]]] = {}
        """Per node: its last probes as (partner, MB/s)."""
        self.reported: set[str] = set()

    def add(self, sender: str, sink: str, mbps: float) -> None:
        for node, partner in ((sender, sink), (sink, sender)):
            self.samples.setdefault(node, deque(maxlen=self.s.window)).append((partner, mbps))

    def forget(self, node: str) -> None:
        self.samples.pop(node, None)
        self.reported.discard(node)

    def restart(self) -> None:
        """Every window starts over (what a node reported stays reported until it is fast again)."""
        self.samples.clear()

    def best(self) -> dict[str, float]:
        """Each node with a full window of at least two partners: its best throughput."""
        return {
            n: max(m for _, m in d)
            for n, d in self.samples.items()
            if len(d) >= self.s.window and len({p for p, _ in d}) >= 2
        }

    def judge(self) -> list[SlowLink]:
        best = self.best()
        if len(best) < 3:
            return []
        ref = statistics.median(best.values())
        slow = {n for n, b in best.items() if b * self.s.factor <= ref}
        self.reported &= slow | (set(self.samples) - set(best))  # a node fast again may be reported again
        if len(slow) * 2 >= len(best):
            return []  # half of the nodes slow together: a shared cause, nobody is singled out
        found = [SlowLink(n, round(best[n], 3), round(ref, 3)) for n in sorted(slow - self.reported)]
        self.reported |= {f.node for f in found}
        return found

    @staticmethod
    def pairs(nodes: list[str], round_no: int) -> list[tuple[str, str]]:
        """(sender, sink) for one round: node i sends to node i + k, k = 1 + round mod (n - 1)."""
        n = len(nodes)
        if n < 2:
            return []
        k = 1 + round_no % (n - 1)
        return [(nodes[i], nodes[(i + k) % n]) for i in range(n)]


@dataclass(frozen=True)
class Pending:
    sender: str
    sink: str
    sent_m: float
    epoch: int


class LinkProbes:
    """The controller's side of the link probes (``gray.evict`` and ``gray.link_probe_s`` > 0)."""

    def __init__(
        self,
        ctx: Context,
        g: GrayConfig,
        move_off: Callable[[str, str, dict[str, object]], str | None],
        ranks_of_node: Callable[[str], list[int]],
    ) -> None:
        """``g``: the run's gray section (the probes' settings come only from it); ``move_off(node, reason,
        record)``: :meth:`GrayEvictions.move_off`, None once moved, else why not."""
        self.ctx = ctx
        self.move_off = move_off
        self.ranks_of_node = ranks_of_node
        self.period_s = g.link_probe_s
        self.nbytes = g.link_probe_bytes
        self.timeout_s = g.link_probe_timeout_s
        self.watch = LinkWatch(LinkSettings(factor=g.link_slow_factor, window=g.link_window))
        self.sinks: dict[str, tuple[str, int]] = {}
        self.pending: dict[int, Pending] = {}
        self.seq = 0
        self.round_no = 0
        self.next_round_m = 0.0
        self.moved: set[str] = set()
        """Nodes moved off: no longer probed."""
        self.said: dict[str, str] = {}
        """The last reason journalled for a slow node that was not moved, per node."""
        self.probes = 0
        self.failed = 0
        self.epoch = -1
        self.settled_at = 0
        """The step from which the current epoch counts as steady."""

    def sink_at(self, node: str, msg: SinkAt) -> None:
        self.sinks[node] = (msg.host, msg.port)

    def forget(self, node: str) -> None:
        """The node's monitor is gone: no probes to or from it, its samples dropped."""
        self.sinks.pop(node, None)
        self.watch.forget(node)

    def tick(self, now_m: float, channels: dict[str, LineChannel]) -> None:
        """Start a round when one is due: a probe from every live monitor with a sink to another."""
        stale = [s for s, p in self.pending.items() if now_m - p.sent_m > self.timeout_s + 10.0]
        for s in stale:
            del self.pending[s]
        if now_m < self.next_round_m or not self._steady():
            return
        self.next_round_m = now_m + self.period_s
        nodes = sorted(n for n in self.sinks if n in channels and n not in self.moved)
        busy = {p.sender for p in self.pending.values()}
        for sender, sink in LinkWatch.pairs(nodes, self.round_no):
            if sender in busy:
                continue  # its last probe is still out (a slow link): its answer comes first
            self.seq += 1
            host, port = self.sinks[sink]
            if channels[sender].try_send(ProbeLink(seq=self.seq, host=host, port=port, nbytes=self.nbytes)):
                self.pending[self.seq] = Pending(sender, sink, now_m, self.epoch)
        self.round_no += 1

    def _steady(self) -> bool:
        st = self.ctx.state
        if st.epoch != self.epoch:
            self.epoch, self.settled_at = st.epoch, st.step + SETTLE_STEPS
            self.watch.restart()
        return st.mode is Mode.RUNNING and st.plan is None and st.step >= self.settled_at

    def probed(self, node: str, msg: Probed) -> None:
        p = self.pending.get(msg.seq)
        if p is None or p.sender != node:
            log.debug("probe result %d from %s matches no request", msg.seq, node)
            return
        del self.pending[msg.seq]
        self.probes += 1
        if not self._steady() or p.epoch != self.epoch:
            return  # sent before a change, or answered during one: it measured a busy host
        if msg.seconds is not None and msg.seconds > 0:
            mbps = self.nbytes / msg.seconds / 1e6
        elif msg.timed_out:
            mbps = self.nbytes / self.timeout_s / 1e6  # at most this: a timeout is a slow sample too
        else:
            self.failed += 1
            return  # refused, reset: a dead or cut-off node is the monitors' business, not a slow one
        if p.sink in self.moved or p.sender in self.moved:
            return
        self.watch.add(p.sender, p.sink, mbps)
        for slow in self.watch.judge():
            self._act(slow)

    def _act(self, slow: SlowLink) -> None:
        reason = (
            f"gray: node {slow.node}'s link moved at most {slow.best_mbps:.1f} MB/s over its last "
            f"{self.watch.s.window} probes, the nodes' median {slow.median_mbps:.1f} MB/s"
        )
        record: dict[str, object] = {"cause": "link", "best_mbps": slow.best_mbps, "median_mbps": slow.median_mbps}
        if not self.ranks_of_node(slow.node):
            return self._keep(slow, "no rank on the node", record)
        why = self.move_off(slow.node, reason, record)
        if why is None:
            self.moved.add(slow.node)
            self.watch.forget(slow.node)
        else:
            self._keep(slow, why, record)

    def _keep(self, slow: SlowLink, why: str, record: dict[str, object]) -> None:
        self.watch.reported.discard(slow.node)  # judged again at its next probe
        if self.said.get(slow.node) != why:
            self.said[slow.node] = why
            self.ctx.journal.write("link_slow", node=slow.node, kept=why, step=self.ctx.state.step, **record)
            log.warning(
                "gray: node %s's link is slow (%.1f MB/s, median %.1f); kept: %s",
                slow.node,
                slow.best_mbps,
                slow.median_mbps,
                why,
            )

    def report(self) -> dict[str, object]:
        return {
            "probes": self.probes,
            "failed": self.failed,
            "moved": sorted(self.moved),
            "best_mbps": {n: round(b, 3) for n, b in sorted(self.watch.best().items())},
        }
