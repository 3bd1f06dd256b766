"""Golden files for the sbatch scripts submitit generates for the main job and a spare.

Regenerate after an intended change with ``TMSLURM_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_sbatch_golden.py``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tmslurm.core.config import compose_config
from tmslurm.slurm.placement import placement_of
from tmslurm.slurm.submit import main_sbatch_text, spare_sbatch_text, time_minutes

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
CASES = {
    "main-dp2-pp2": (main_sbatch_text, ["cluster=slurm", "parallel.dp=2", "parallel.pp=2"]),
    "main-rpn2-account-qos": (
        main_sbatch_text,
        [
            "cluster=slurm",
            "parallel.ranks_per_node=2",
            "slurm.account=proj",
            "slurm.extra_args=['--qos=high']",
            "slurm.time=1-02:00:00",
            "slurm.partition=gpu",
        ],
    ),
    "spare-exclude": (spare_sbatch_text, ["cluster=slurm"]),
    "spare-inherited-placement": (spare_sbatch_text, ["cluster=slurm", "slurm.spare_args=['--qos=standby']"]),
    "main-resubmit": (main_sbatch_text, ["cluster=slurm", "slurm.signal_lead_s=300"]),
}
# The main job that spare-inherited-placement's spare serves was submitted by hand:
# sbatch -p gpu -A proj -q high -C h100 --gres=gpu:8 scripts/tmslurm.sbatch ... (slurm.* left default)
MAIN_JOB = {"Partition": "gpu", "Account": "proj", "QOS": "high", "Features": "h100", "TresPerNode": "gres/gpu:8"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_sbatch_matches_golden_file(name, tmp_path):
    fn, overrides = CASES[name]
    cfg = compose_config(overrides)
    args = (tmp_path / "run", cfg) if fn is main_sbatch_text else (tmp_path / "run", cfg, ["node2", "node5"])
    if name == "spare-inherited-placement":
        args = (*args, placement_of(MAIN_JOB))
    text = fn(*args, **({"after": "4242"} if name == "main-resubmit" else {}))
    assert str(tmp_path) not in text
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("TMSLURM_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_main_job_keeps_running_on_node_loss_and_spares_do_not_requeue(tmp_path):
    main = main_sbatch_text(tmp_path, compose_config(["cluster=slurm"]))
    assert "#SBATCH --no-kill" in main and "#SBATCH --requeue" in main and "--nodes=1 --ntasks=1" in main
    spare = spare_sbatch_text(tmp_path, compose_config(["cluster=slurm"]), ["node3"])
    assert "#SBATCH --no-requeue" in spare and "#SBATCH --exclude=node3" in spare and "#SBATCH --nodes=1" in spare


@pytest.mark.parametrize(
    "text,minutes", [("00:30:00", 30), ("1-02:00:00", 1560), ("45", 45), ("10:30", 11), ("00:00:10", 1)]
)
def test_slurm_time_forms(text, minutes):
    assert time_minutes(text) == minutes


def test_bad_slurm_time_names_the_override():
    from tmslurm.core.errors import ConfigError

    with pytest.raises(ConfigError, match="slurm.time"):
        time_minutes("soon")


def _sbatch_options(text: str) -> dict[str, str]:
    lines = [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    return dict((opt.split("=", 1) + [""])[:2] for opt in lines)


def test_the_sbatch_wrapper_asks_for_what_tmslurm_launch_asks_for(tmp_path):
    """scripts/tmslurm.sbatch and tmslurm-launch's main job: same name, exclusive nodes, --no-kill,
    --requeue, one task per node and the default signal lead (the wrapper's to its batch shell,
    ``B:``, which runs the supervisor itself; tmslurm-launch's to every step)."""
    wrapper = _sbatch_options((Path(__file__).resolve().parents[2] / "scripts" / "tmslurm.sbatch").read_text())
    main = _sbatch_options(main_sbatch_text(tmp_path / "run", compose_config(["cluster=slurm"])))
    for opt in ("--job-name", "--exclusive", "--no-kill", "--requeue", "--ntasks-per-node"):
        assert wrapper[opt] == main[opt], opt
    assert wrapper["--signal"] == "B:" + main["--signal"]
    assert "--partition" not in wrapper and "--partition" not in main  # the cluster's default partition
