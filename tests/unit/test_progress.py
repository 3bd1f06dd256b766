"""tmslurm.core.progress: durations, lines, the estimate from an injected clock, plain vs in-place output."""

from __future__ import annotations

import io

import pytest

from tmslurm.core.progress import CLEAR_LINE, Progress, format_duration, progress_line, remaining_s


class FakeStream(io.StringIO):
    """A stream that says whether it is a terminal and counts its flushes."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty
        self.flushes = 0

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "seconds,text",
    [
        (0, "0s"),
        (0.4, "0s"),
        (-5, "0s"),
        (41, "41s"),
        (59.6, "1m00s"),
        (250, "4m10s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (7500, "2h05m"),
        (86400, "1d00h"),
        (273600, "3d04h"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "done,total,elapsed,left",
    [
        (0, 12, 30.0, None),  # nothing finished: no estimate
        (3, None, 30.0, None),  # total unknown: no estimate
        (3, 12, 30.0, 90.0),  # 10 s per unit, 9 left
        (12, 12, 30.0, 0.0),  # all done
        (14, 12, 30.0, 0.0),  # more than the total (a retry counted twice): never negative
        (3, 12, -1.0, 0.0),  # a clock that went back: never negative
    ],
)
def test_remaining_is_the_mean_time_per_finished_unit_times_the_units_left(done, total, elapsed, left):
    assert remaining_s(done, total, elapsed) == left


@pytest.mark.parametrize(
    "done,total,elapsed,remaining,counts,note,line",
    [
        (3, 12, 250, 750, {"events": 30}, "", "cells 3/12, events 30, elapsed 4m10s, remaining ~12m30s"),
        (3, None, 250, None, {}, "", "cells 3, elapsed 4m10s"),
        (0, 12, 5, None, {}, "starting", "cells 0/12, elapsed 5s (starting)"),
        (
            1,
            2,
            61,
            61,
            {"events": 2, "lost": 0},
            "large kill",
            "cells 1/2, events 2, lost 0, elapsed 1m01s, remaining ~1m01s (large kill)",
        ),
    ],
)
def test_progress_line(done, total, elapsed, remaining, counts, note, line):
    assert progress_line("cells", done, total, elapsed, remaining, counts, note) == line


def test_plain_output_is_one_flushed_line_per_update_with_no_control_characters():
    clock, out = FakeClock(), FakeStream(tty=False)
    p = Progress(4, "cells", out, title="bench x", clock=clock)
    clock.t += 20
    p.count("events", 5)
    p.advance(note="small shadow")
    clock.t += 40
    p.count("events", 5)
    p.advance()
    p.close()
    assert out.getvalue().splitlines() == [
        "bench x: cells 1/4, events 5, elapsed 20s, remaining ~1m00s (small shadow)",
        "bench x: cells 2/4, events 10, elapsed 1m00s, remaining ~1m00s",
    ]
    assert out.getvalue().endswith("\n") and "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert out.flushes == 2


def test_on_a_terminal_the_line_is_redrawn_in_place_and_ended_at_the_last_unit():
    clock, out = FakeClock(), FakeStream(tty=True)
    p = Progress(2, "steps", out, clock=clock)
    clock.t += 10
    p.advance()
    assert out.getvalue() == CLEAR_LINE + "progress: steps 1/2, elapsed 10s, remaining ~10s"
    clock.t += 10
    p.advance()
    assert out.getvalue().endswith(CLEAR_LINE + "progress: steps 2/2, elapsed 20s, remaining ~0s\n")
    p.close()  # already ended: no second newline
    assert out.getvalue().count("\n") == 1


def test_close_ends_an_open_line_on_a_terminal_when_the_total_is_unknown():
    out = FakeStream(tty=True)
    p = Progress(None, "steps", out, clock=FakeClock())
    p.update(7)
    assert not out.getvalue().endswith("\n")
    p.close()
    assert out.getvalue() == CLEAR_LINE + "progress: steps 7, elapsed 0s\n"


@pytest.mark.parametrize(
    "tty,inplace,expect_inplace", [(False, None, False), (True, None, True), (True, False, False), (False, True, True)]
)
def test_inplace_defaults_to_whether_the_stream_is_a_terminal(tty, inplace, expect_inplace):
    assert Progress(3, "cells", FakeStream(tty), inplace=inplace).inplace is expect_inplace


def test_without_a_stream_it_only_formats():
    clock = FakeClock()
    p = Progress(60, "steps", None, title="", clock=clock)
    clock.t += 30
    assert p.update(20) == "steps 20/60, elapsed 30s, remaining ~1m00s"
    assert (p.inplace, p.open_line) == (False, False)
