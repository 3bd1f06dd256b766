"""benchmarks.zero's in-process part: optimizer bytes per rank at zero=0 and zero=1, and a cell's p50s."""

from __future__ import annotations

import pytest

from benchmarks.zero import _cell, optimizer_bytes


@pytest.mark.parametrize("dp,pp,ratio", [(4, 1, 0.5), (2, 2, 1.0), (8, 1, 0.25)])
def test_optimizer_bytes_ratio_is_two_slices_of_dp(dp, pp, ratio):
    """With the buddy a rank holds 2/dp of the moments (padding aside): 0.5 at dp=4, as the issue's 0.55 allows."""
    b = optimizer_bytes("tiny", dp, pp)
    assert len(b["per_stage"]) == pp
    for st in b["per_stage"]:
        assert 0 <= st["zero1_with_buddy_bytes"] - 2 * st["zero1_own_bytes"] <= 16  # + two 0-dim step counts
        assert st["optimizer_bytes_ratio"] == pytest.approx(ratio, abs=0.002)
    assert b["optimizer_bytes_ratio_max"] == max(st["optimizer_bytes_ratio"] for st in b["per_stage"])


def test_cell_lists_samples_and_takes_p50s():
    evs = [{"downtime_s": d, "pause_s": d + 0.01, "transfer_s": 0.0} for d in (0.3, 0.1, 0.2)]
    c = _cell(evs)
    assert (c["n"], c["downtime_p50_s"], c["pause_p50_s"]) == (3, 0.2, 0.21)
    assert c["downtime_samples_s"] == [0.3, 0.1, 0.2]
