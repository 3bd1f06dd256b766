"""benchmarks.abortpoints: its spread figures, and a short run that writes both timings."""

from __future__ import annotations

import json
from argparse import Namespace

from benchmarks import abortpoints


def test_spread_is_nearest_rank_in_milliseconds():
    xs = [i / 1000 for i in range(1, 11)]  # 1..10 ms
    assert abortpoints.spread(xs) == {"p50_ms": 5.5, "p10_ms": 2.0, "p90_ms": 10.0}


def test_a_short_run_times_both_settings_and_writes_them(tmp_path):
    out = tmp_path / "a.json"
    r = abortpoints.main(Namespace(model="tiny", repeats=3, json=str(out)))
    saved = json.loads(out.read_text())
    assert saved["n"] == 3 and saved["disarmed"]["p50_ms"] > 0 and saved["armed"]["p50_ms"] > 0
    assert r["difference_p50_ms"] == round(r["armed"]["p50_ms"] - r["disarmed"]["p50_ms"], 4)
    assert isinstance(r["paired_difference_p50_ms"], float)
