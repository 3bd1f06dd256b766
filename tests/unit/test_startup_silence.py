"""An agent still starting (before its ``started`` or first ``ready``) may be silent for
``runtime.connect_timeout_s``; once started, ``detect.heartbeat_timeout_s`` fences it."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller_harness import Harness

SILENT_S = 10.0
"""Past heartbeat_timeout_s (3 s), well within connect_timeout_s (120 s)."""


def _silent_tick(h: Harness, who, silent_s: float) -> list[dict]:
    """``who`` was last heard ``silent_s`` ago; one scan of the deadlines; the ``hung`` records."""
    h.state.agents[h.aid(who)].last_seen = time.monotonic() - silent_s
    h.ctl.deadlines.scanned_m = float("-inf")  # the scan is rate-limited: let this tick scan
    h.ctl.deadlines.tick()
    return [e for e in h.journal("hung") if e["agent"] == h.aid(who)]


def _started(h: Harness, who) -> None:
    h.send(who, {"type": "started", "rank": who, "step": 0, "groups_s": 0.1, "ckpt_load_s": 0.0})


def _ready(h: Harness, who) -> None:
    h.send(
        who,
        {
            "type": "ready",
            "role": h.ctl.ctx.layout.roles[0],
            "warmup_s": 0.1,
            "rss_mb": 1.0,
            "role_rss_mb": 1.0,
            "sandbox_sends_skipped": 0,
        },
    )


@pytest.mark.parametrize(
    "silent_s, report, fenced",
    [
        (SILENT_S, None, False),  # a rank still building its groups on a loaded host
        (SILENT_S, _started, True),  # the same silence once it started
        (200.0, None, True),  # a start-up past connect_timeout_s hangs
        (1.0, _started, False),  # within heartbeat_timeout_s
    ],
)
def test_a_rank_is_allowed_connect_timeout_while_it_starts(tmp_path, silent_s, report, fenced):
    h = Harness(tmp_path, 2, 2, 1)
    if report is not None:
        report(h, 1)
    assert bool(_silent_tick(h, 1, silent_s)) is fenced
    assert (("worker", 1) in h.spawner.fenced) is fenced


def test_a_standby_starts_until_its_first_ready(tmp_path):
    h = Harness(tmp_path, 2, 2, 0)
    h.ctl.members.spawn_standby()
    h.hello("s9", "standby", 0, "s9")
    assert not _silent_tick(h, "s9", SILENT_S)  # warming its first class
    _ready(h, "s9")
    assert _silent_tick(h, "s9", SILENT_S)
    assert ("standby", 0) in h.spawner.fenced


def test_started_ends_the_start_up(tmp_path):
    h = Harness(tmp_path, 2, 2, 0)
    assert h.state.agents[h.aid(1)].starting
    _started(h, 1)
    assert not h.state.agents[h.aid(1)].starting
