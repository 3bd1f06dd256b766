"""A Slurm command that hangs never delays a commit: ``scancel`` and ``sbatch`` wrapped so that they
block for as long as the test says, during a recovery on the real cluster.

The run's PATH starts with a directory of wrappers (the batch job inherits it). Once the run is
warm, the test raises a flag: from then on every ``scancel``/``sbatch`` logs its start and blocks
until the flag is gone. A rank then stops itself (SIGSTOP: its step stays, so fencing it needs
``scancel``): the controller fences its step (``scancel``, blocked) and submits a replacement spare
(``sbatch``, blocked). The test waits until the standby
took the rank over and five more steps committed, checks that both commands were called and are
still blocked, and only then lowers the flag. The run ends bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.slurm.test_slurm_run import COMMON, STEPS, SlurmRun, exact, reference_hash

pytestmark = pytest.mark.slurm
WRAPPER = """#!/bin/bash
echo "start {name} $(date +%s.%N)" >> {log}
for _ in $(seq 1 1200); do [ -e {flag} ] || break; sleep 0.05; done
echo "end {name} $(date +%s.%N)" >> {log}
exec {real} "$@"
"""


def wrappers(tmp_path: Path) -> tuple[Path, Path, Path]:
    bin_dir, flag, log = tmp_path / "bin", tmp_path / "hang", tmp_path / "wrapped.log"
    bin_dir.mkdir()
    for name in ("scancel", "sbatch"):
        real = shutil.which(name)
        assert real, f"{name} not on PATH"
        path = bin_dir / name
        path.write_text(WRAPPER.format(name=name, log=log, flag=flag, real=real))
        path.chmod(0o755)
    return bin_dir, flag, log


def wrapped(log: Path) -> list[tuple[str, str, float]]:
    lines = log.read_text().split("\n") if log.exists() else []
    return [(p[0], p[1], float(p[2])) for p in (line.split() for line in lines) if len(p) == 3]


def still_blocked(calls: list[tuple[str, str, float]]) -> set[str]:
    """Commands with more starts than ends in the wrappers' log."""
    count = Counter((kind, name) for kind, name, _ in calls)
    return {name for _, name, _ in calls if count["start", name] > count["end", name]}


def test_hanging_scancel_and_sbatch_during_a_recovery_do_not_delay_commits(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, "parallel.dp=2", "parallel.pp=2")
    bin_dir, flag, log = wrappers(tmp_path)
    env = {**slurm.env, "PATH": f"{bin_dir}{os.pathsep}{slurm.env.get('PATH', os.defpath)}"}
    cluster = dataclasses.replace(slurm, env=env)
    run = SlurmRun(
        cluster,
        tmp_path / "run",
        ["parallel.dp=2", "parallel.pp=2", "standby.count=1", *COMMON, "faults=[{step:20,kind:stop,rank:2}]"],
    )
    run.wait_step(8)
    flag.touch()  # from now on scancel and sbatch block
    run.wait_for(lambda e: e["type"] == "joined" and e["rank"] == 2, what="standby took rank 2")
    joined_step = run.status()["step"]
    after = joined_step + 5
    deadline = time.monotonic() + 120
    while run.status().get("step", 0) < after:  # no warm standby is left to wait for: only steps
        assert time.monotonic() < deadline, f"step {after} not reached\n{run.logs()}"
        time.sleep(0.2)
    calls = wrapped(log)
    hanging = still_blocked(calls)
    # the fence (scancel) and the replacement spare (sbatch) were called and, five commits later, still hang
    assert {"scancel", "sbatch"} <= hanging, calls
    released_t = time.time()
    flag.unlink()
    s = run.summary()
    assert exact(s, ref), s
    (ev,) = [e for e in s["events"] if e["kind"] == "unexpected"]
    assert ev["ranks"] == [2] and ev["downtime_s"] < 10, ev
    commits = [e for e in s["step_log"] if joined_step <= e["step"] < after]  # status "step": steps committed so far
    assert len(commits) == 5 and all(e["t_end"] < released_t for e in commits), (commits, released_t)
    assert s["steps"] == STEPS
    print(json.dumps({"wrapped": wrapped(log), "event": ev}, default=str)[:2000])
