"""Log lines carry run, who and step; a callable field is read at each line (the controller's and
the supervisor's step), and one that raises gives ``?`` instead of failing the line."""

from __future__ import annotations

import json
import logging

import pytest

from tmslurm.core import logs
from tmslurm.core.rundir import RunDir
from tmslurm.run.supervisor import log_as_supervisor


@pytest.fixture
def context():
    saved = dict(logs.LOG_CONTEXT)  # the one dict every module imported: restored, not replaced
    yield logs.LOG_CONTEXT
    logs.LOG_CONTEXT.clear()
    logs.LOG_CONTEXT.update(saved)


def _fields() -> tuple:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "x", None, None)
    logs.ContextFilter().filter(record)
    return record.run, record.who, record.step


def _boom() -> int:
    raise RuntimeError("no step")


@pytest.mark.parametrize("step,expected", [(7, 7), ("-", "-"), (lambda: 12, 12), (_boom, "?")])
def test_step_field(context, step, expected):
    context.update(run="r1", who="controller", step=step)
    assert _fields() == ("r1", "controller", expected)


def test_supervisor_lines_carry_the_latest_snapshot_step(context, tmp_path):
    rd = RunDir(tmp_path / "run7")
    rd.path.mkdir()
    log_as_supervisor(rd)
    assert _fields() == ("run7", "supervisor", "-")  # no snapshot yet
    rd.snapshot.write_text(json.dumps({"step": 41}))
    assert _fields()[2] == 41
    rd.snapshot.write_text("{not json")
    assert _fields()[2] == "-"
