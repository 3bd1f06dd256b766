"""The incremental median step time against the whole-log recomputation it replaces."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from tmslurm.controller.steptimes import RunningMedian, StepTimes


def brute(log: list[dict]) -> float:
    gaps = [b["t_end"] - a["t_end"] for a, b in zip(log, log[1:]) if b["step"] == a["step"] + 1]
    return statistics.median(gaps) if gaps else 0.0


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), max_size=200))
def test_running_median_is_the_median_after_every_value(xs):
    m = RunningMedian()
    assert m.median() == 0.0
    for i, x in enumerate(xs):
        m.add(x)
        assert m.median() == statistics.median(xs[: i + 1]) and len(m) == i + 1


# a step log grows by commits; steps can jump (a restart redoes from a checkpoint, or resumes later)
entries = st.lists(
    st.tuples(st.integers(min_value=1, max_value=3), st.floats(min_value=0.001, max_value=10.0)), max_size=60
)


def grow(log: list[dict], steps: list[tuple[int, float]]) -> None:
    step, t = (log[-1]["step"], log[-1]["t_end"]) if log else (0, 0.0)
    for jump, dt in steps:
        step, t = step + jump, t + dt
        log.append({"step": step, "t_end": t})


@given(entries, entries, entries)
def test_median_step_follows_a_growing_log_and_a_replaced_one(first, more, saved):
    times, log = StepTimes(), []
    for chunk in (first[: len(first) // 2], first[len(first) // 2 :], more):
        grow(log, chunk)
        assert times.median(log) == brute(log)
    replaced: list[dict] = []  # a restart loads the saved log: a new list, maybe shorter
    grow(replaced, saved)
    assert times.median(replaced) == brute(replaced)
    del replaced[len(replaced) // 2 :]  # shrank in place
    assert times.median(replaced) == brute(replaced)
    grow(replaced, first)
    assert times.median(replaced) == brute(replaced)
