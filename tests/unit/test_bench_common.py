"""benchmarks.common's medians: non-numbers are left out, and median_of names what had no samples."""

from __future__ import annotations

import pytest

from benchmarks.common import median, median_of
from tmslurm.core.errors import TmslurmError


def test_median_leaves_out_what_is_not_a_number():
    assert median([3.0, None, 1, "x", 2.0]) == 2.0
    assert median([None, "x"]) is None


def test_median_of_raises_naming_the_series_without_samples():
    assert median_of([0.5, None, 1.5], "phase2_s") == 1.0
    with pytest.raises(TmslurmError, match="no samples of phase2_s"):
        median_of([None], "phase2_s")
