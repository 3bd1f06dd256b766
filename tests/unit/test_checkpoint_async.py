"""Asynchronous checkpoints (tmslurm.train.async_checkpoint): the snapshot, not the live state, is saved;
``meta.json`` appears only once the files are written; a failing writer surfaces its error."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from tmslurm.comm.stage_comm import SoloStageComm
from tmslurm.core.config import MODEL_PRESETS, TrainConfig
from tmslurm.core.errors import CheckpointError
from tmslurm.train import checkpoint
from tmslurm.train.async_checkpoint import AsyncCheckpointer
from tmslurm.train.model import ReferenceTask
from tmslurm.train.schedule import StageRunner
from tmslurm.train.task import StageSpec


def runner(steps: int) -> StageRunner:
    """The whole tiny model on one rank after ``steps`` AdamW steps (so optimizer moments exist)."""
    task = ReferenceTask(MODEL_PRESETS["tiny"], TrainConfig())
    r = StageRunner(task, StageSpec(0, 1, "only", range(4)), 0, 1, 2, torch.device("cpu"))
    for step in range(steps):
        r.compute(step, SoloStageComm())
        r.apply()
    return r


@pytest.fixture
def gated_writer(monkeypatch):
    """DCP's file writer blocks until the gate opens: the save is provably in flight meanwhile."""
    gate = threading.Event()
    original = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        assert gate.wait(60), "test never opened the gate"
        return original(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", write_data)
    return gate


def test_saves_the_snapshot_not_the_state_mutated_while_in_flight(tmp_path, gated_writer):
    live = runner(2)
    before = live.state_digest()
    saver = AsyncCheckpointer(tmp_path / "async")
    path = saver.save(2, 0, live)
    assert saver.in_flight and not (path / "meta.json").exists()
    assert checkpoint.latest_complete(tmp_path / "async", 1) is None
    with torch.no_grad():  # training goes on: parameters and moments change under the writer
        for p in live.params:
            p.add_(1.0)
        for st in live.optimizer.state.values():
            st["exp_avg"].mul_(3.0)
    assert live.state_digest() != before
    gated_writer.set()
    assert saver.wait() >= 0.0 and not saver.in_flight
    assert checkpoint.latest_complete(tmp_path / "async", 1) == 2
    fresh = runner(0)
    checkpoint.load_stage(tmp_path / "async", 2, 0, fresh)
    assert fresh.state_digest() == before


def test_async_files_match_a_synchronous_save(tmp_path, gated_writer):
    gated_writer.set()
    live = runner(1)
    sync = checkpoint.save_stage(tmp_path / "sync", 1, 0, live)
    saver = AsyncCheckpointer(tmp_path / "async")
    path = saver.save(1, 0, live)
    saver.wait()
    assert json.loads((path / "meta.json").read_text()) == json.loads((sync / "meta.json").read_text())
    assert json.loads((path / "meta.json").read_text())["digest"] == live.digest()


def test_a_failing_writer_surfaces_at_the_next_wait_and_leaves_no_marker(tmp_path, monkeypatch, caplog):
    def full_disk(self, plan, planner):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FileSystemWriter, "write_data", full_disk)
    saver = AsyncCheckpointer(tmp_path)
    with caplog.at_level(logging.ERROR, logger="tmslurm.train.async_checkpoint"):
        path = saver.save(5, "stage0", runner(1))
        with pytest.raises(CheckpointError, match=r"step=5 stage0 .*No space left on device"):
            saver.wait()
    assert any("step=5" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert not (path / "meta.json").exists() and checkpoint.latest_complete(tmp_path, 1) is None
    assert saver.wait() == 0.0  # reported once; nothing in flight any more


def test_the_next_save_raises_the_previous_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(
        FileSystemWriter, "write_data", lambda self, plan, planner: (_ for _ in ()).throw(OSError("EIO"))
    )
    saver = AsyncCheckpointer(tmp_path)
    live = runner(1)
    saver.save(5, 0, live)
    with pytest.raises(CheckpointError, match="step=5"):
        saver.save(10, 0, live)


class _ObservedEvent(threading.Event):
    """An Event that tells when somebody starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_save_due_while_one_is_in_flight_waits_for_it_and_says_so(tmp_path, gated_writer, caplog):
    live = runner(1)
    saver = AsyncCheckpointer(tmp_path)
    saver.save(5, 0, live)
    first = saver.pending
    first.done = observed = _ObservedEvent()  # the writer is held at the gate: nothing has set it yet
    second = threading.Thread(target=saver.save, args=(10, 0, live))
    with caplog.at_level(logging.INFO, logger="tmslurm.train.async_checkpoint"):
        second.start()
        assert observed.waiting.wait(60)  # the second save is blocked on the first, not queued
        assert checkpoint.latest_complete(tmp_path, 1) is None and saver.pending is None
        gated_writer.set()
        second.join(60)
        saver.wait()
    assert [r for r in caplog.records if "checkpoint step=10 waited" in r.getMessage() and "(step 5)" in r.getMessage()]
    assert (
        checkpoint.latest_complete(tmp_path, 1) == 10
        and (checkpoint.checkpoint_dir(tmp_path, 5) / "stage0" / "meta.json").is_file()
    )
