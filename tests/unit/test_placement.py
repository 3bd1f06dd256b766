"""What spares and a resubmitted main job inherit from the main job, read from real ``scontrol
show job`` output (tests/fixtures/slurm) and from the forms each Slurm version prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmslurm.core.config import compose_config
from tmslurm.slurm.parse import parse_jobs
from tmslurm.slurm.placement import Placement, placement_from_config, placement_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


@pytest.mark.parametrize(
    "version,expected",
    [
        ("22.05", Placement(partition="debug", account="root", qos="normal")),  # accounting on: account and QOS set
        ("24.11", Placement(partition="debug")),  # no accounting: (null) stays unset
    ],
)
def test_real_scontrol_output(version, expected):
    (job,) = parse_jobs((FIXTURES / version / "scontrol-o-show-job-running.txt").read_text().partition("\n")[2])
    assert placement_of(job.raw) == expected


@pytest.mark.parametrize(
    "raw,expected",
    [
        (
            {"Features": "h100&ib", "TresPerNode": "gres:gpu:8"},
            Placement(constraint="h100&ib", gres="gpu:8"),
        ),  # 22.05 form
        ({"TresPerNode": "gres/gpu:8,gres/nic:1"}, Placement(gres="gpu:8,nic:1")),  # 23.02+ form
        ({"TresPerNode": "gres/gpu:a100:4"}, Placement(gres="gpu:a100:4")),
        ({"TresPerNode": "cpu:4,gres/gpu:2"}, Placement(gres="gpu:2")),  # not a GRES: dropped, never guessed
        ({"TresPerNode": "cpu:4"}, Placement()),
        ({"Partition": "(null)", "Account": "N/A", "QOS": "", "Features": "(null)"}, Placement()),
        ({}, Placement()),
    ],
)
def test_fields_and_forms(raw, expected):
    assert placement_of(raw) == expected


def test_params_leave_out_what_is_unset_and_the_partition():
    p = Placement(partition="gpu", qos="high", gres="gpu:8")
    assert p.sbatch_params() == {"qos": "high", "gres": "gpu:8"}
    assert p.describe() == "partition=gpu qos=high gres=gpu:8"
    assert Placement().describe() == "(cluster defaults)"


def test_a_first_submission_uses_the_config():
    cfg = compose_config(["cluster=slurm", "slurm.partition=gpu", "slurm.account=proj"])
    assert placement_from_config(cfg) == Placement(partition="gpu", account="proj")
