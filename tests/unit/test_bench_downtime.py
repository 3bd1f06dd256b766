"""The downtime benchmark's summary: nearest-rank percentiles and per-cell spread with every sample."""

from __future__ import annotations

import pytest

from tmslurm.bench.downtime import _pct, spread


@pytest.mark.parametrize("xs,q,want", [
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50, 5), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90, 9),
    ([0.5], 90, 0.5), ([], 50, None), ([1, 2], 50, 1), ([1, 2], 90, 2),
])
def test_nearest_rank_percentile(xs, q, want):
    assert _pct(sorted(xs), q) == want


def test_spread_lists_every_sample_per_cell_and_skips_run_rows():
    rows = [{"event": "unexpected", "strategy": "tmslurm", "downtime_s": d, "parts": {"detect_s": d - 0.1}}
            for d in (0.9, 1.1, 1.0)]
    rows += [{"event": "_run", "strategy": "tmslurm", "downtime_s": None, "parts": {}}]
    cell = spread(rows)["tmslurm"]["unexpected"]
    assert cell["samples"] == [0.9, 1.1, 1.0] and cell["n"] == 3
    assert cell["p50"] == 1.0 and cell["p90"] == 1.1 and cell["detect_p50"] == pytest.approx(0.9)
