"""The standby's sandbox communicator: a recording gives the boundary values; the data-parallel
all-reduce keeps only its shape and is replayed as the identity (no flat gradient held or copied)."""

from __future__ import annotations

import pytest
import torch

from tmslurm.comm.stage_comm import RecordingStageComm, SandboxStageComm
from tmslurm.core.errors import CommError


class Inner:
    """A stand-in for the fabric's communicator: the 'reduced' gradient is the input doubled."""

    def allreduce(self, flat: torch.Tensor) -> torch.Tensor:
        return flat * 2

    def recv_act(self, micro: int) -> torch.Tensor:
        return torch.full((1, 2, 3), float(micro))


def _recorded(tmp_path, flat_shape=(10,)):
    rec = RecordingStageComm(Inner(), tmp_path / "rec.pt")
    rec.recv_act(1)
    rec.allreduce(torch.ones(flat_shape))
    rec.save()
    return tmp_path / "rec.pt"


def test_the_recording_keeps_the_reduction_shape_not_its_values(tmp_path):
    saved = torch.load(_recorded(tmp_path), weights_only=True)
    assert saved["allreduce"].tolist() == [10]
    assert torch.equal(saved["act/1"], torch.full((1, 2, 3), 1.0))


def test_the_sandbox_replays_values_and_reduces_to_the_identity(tmp_path):
    sandbox = SandboxStageComm(_recorded(tmp_path), torch.device("cpu"))
    assert torch.equal(sandbox.recv_act(1), torch.full((1, 2, 3), 1.0))
    flat = torch.arange(10.0)
    assert sandbox.allreduce(flat) is flat and torch.equal(flat, torch.arange(10.0))


def test_a_reduction_of_another_shape_is_refused_with_the_file_named(tmp_path):
    sandbox = SandboxStageComm(_recorded(tmp_path), torch.device("cpu"))
    with pytest.raises(CommError, match="rec.pt.*all-reduce shape"):
        sandbox.allreduce(torch.zeros(11))
