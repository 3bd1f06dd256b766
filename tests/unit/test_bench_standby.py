"""``bench standby``: which standbys count as warm (every shape class), and where their pids come from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import standby


def _ready(aid: str, role: str, warm: bool = True) -> dict:
    return {"type": "standby_ready", "agent": aid, "role": role, "warm": warm, "role_rss_mb": 80.0, "warmup_s": 1.0}


@pytest.mark.parametrize(
    "entries,n,want",
    [
        ([_ready("standby0.11#3", r) for r in standby.CLASSES], 1, {"standby0.11#3"}),
        ([_ready("standby0.11#3", r) for r in standby.CLASSES], 2, set()),  # the second is not warm yet
        ([_ready("standby0.11#3", r) for r in ("first", "last")], 1, set()),  # middle missing
        ([_ready("standby0.11#3", r, warm=r != "middle") for r in standby.CLASSES], 1, set()),  # middle ready, not warm
    ],
)
def test_ready_needs_every_class_warm_on_every_standby(entries, n, want):
    job = SimpleNamespace(journal=lambda: [{"type": "hello"}, *entries])
    assert set(standby._ready(job, n)) == want


def test_pid_comes_from_the_agent_id():
    assert standby._pid("standby3.4242#17") == 4242
