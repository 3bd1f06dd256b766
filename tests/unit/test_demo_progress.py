"""The demo's step progress: a line every STEP_EVERY steps and at the last, read from the run's snapshot."""

from __future__ import annotations

import io
import json

import pytest

from tmslurm.core.progress import Progress
from tmslurm.tools.demo import StepWatch, follow_steps, snapshot_step


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "steps,lines",
    [
        ([None, 0, 3, 9], []),  # nothing yet, then below the first 10
        (
            [10, 10, 12, 19, 20],
            ["steps 10/60, elapsed 10s, remaining ~50s", "steps 20/60, elapsed 50s, remaining ~1m40s"],
        ),  # once per multiple of 10
        (
            [7, 25, 24, 31],
            ["steps 25/60, elapsed 20s, remaining ~28s", "steps 31/60, elapsed 40s, remaining ~37s"],
        ),  # a jump past two multiples: one line; going back: none
        (
            [55, 60],
            ["steps 55/60, elapsed 10s, remaining ~1s", "steps 60/60, elapsed 20s, remaining ~0s"],
        ),  # the last step
    ],
)
def test_step_watch_writes_a_line_per_multiple_and_at_the_last_step(steps, lines):
    clock, out, seen = FakeClock(), io.StringIO(), iter(steps)
    watch = StepWatch(lambda: next(seen), Progress(60, "steps", out, title="", clock=clock, inplace=False), every=10)
    for _ in steps:
        clock.t += 10
        watch.poll()
    assert out.getvalue().splitlines() == lines


@pytest.mark.parametrize(
    "content,step",
    [
        (None, None),
        ("{not json", None),
        ("[1]", None),
        ('{"step": "x"}', None),
        ('{"epoch": 1}', None),
        ('{"step": 42, "epoch": 1}', 42),
    ],
)
def test_snapshot_step_reads_the_committed_steps_or_none(tmp_path, content, step):
    if content is not None:
        (tmp_path / "snapshot.json").write_text(content)
    assert snapshot_step(tmp_path) == step


def test_follow_steps_writes_the_last_steps_when_the_block_ends(tmp_path, capsys):
    with follow_steps(tmp_path, 60, "reference"):
        (tmp_path / "snapshot.json").write_text(json.dumps({"step": 60}))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("demo reference: steps 60/60, elapsed ")
