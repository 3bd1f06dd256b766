"""scripts/tmslurm-strigger on the real local Slurm cluster (strigger works here: SlurmUser=root).

What Slurm 22.05 does with node triggers decides the design (docs/admin-guide.md, "strigger"):
``--drained`` fires only once a node is DRAINED (after every job left it), ``--fail`` never fires,
``--down`` fires after the run has already seen the loss. The one trigger that fires while the run
still uses a draining node is ``--reconfig`` (any node state change); its program gets no node
list, so the script runs in ``scan`` mode. To prove that the notice came through strigger and not
through the run's own Slurm watcher, the watcher is muted (``slurm.poll_interval_s=600``: it polls
once at start): the journal must show the ``notice`` with ``source`` "admin" (watcher notices say
"slurm"), and the script's log must show the delivery.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_slurm_run import COMMON, SlurmRun, node_state

pytestmark = pytest.mark.slurm
LONG_STEPS = 600  # ~100 s at 0.15 s a step: the test never waits for the end
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tmslurm-strigger"


def _conf(tmp_path: Path, root: Path, key: Path | None, slurm_conf: str) -> tuple[Path, Path]:
    log = tmp_path / "strigger.log"
    lines = [
        f"TMSLURM_PYTHON={sys.executable}",
        f"TMSLURM_RUNS_ROOT={root}",
        f"TMSLURM_STRIGGER_LOG={log}",
        f"SLURM_CONF={slurm_conf}",
    ]
    if key is not None:
        lines.append(f"TMSLURM_ADMIN_PRIVATE_KEY={key}")
    conf = tmp_path / "strigger.conf"
    conf.write_text("# written by tests/slurm/test_strigger.py\n" + "\n".join(lines) + "\n")
    return conf, log


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _wait_log(slurm, path: Path, text: str, timeout: float) -> str:
    slurm.wait_for(lambda: text in _log(path), timeout, interval=0.5, what=f"{text!r} in {path.name}")
    return _log(path)


def _trigger_ids(slurm, marker: str) -> list[str]:
    out = slurm.run("strigger", "--get", "-N", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if marker in line]


def test_reconfig_scan_delivers_the_drain_as_an_admin_notice(slurm, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    key, pub = tmp_path / "admin.key", tmp_path / "admin.pub"
    slurm.run("tmslurm", "keygen", "--private", str(key), "--public", str(pub))
    conf, log = _conf(tmp_path, root, key, slurm.conf)
    # long enough to outlast two trigger intervals (15 s each); the run is cancelled at the end
    common = [o for o in COMMON if not o.startswith(("slurm.poll_interval_s=", "train.steps="))]
    run = SlurmRun(
        slurm,
        root / "run",
        [
            "parallel.dp=2",
            "parallel.pp=2",
            "standby.count=1",
            *common,
            f"train.steps={LONG_STEPS}",
            "slurm.poll_interval_s=600",
            f"security.admin_public_key_file={pub}",
        ],
    )
    st = run.wait_step(8)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 1)
    program = f"{SCRIPT} --conf {conf}"
    slurm.run("strigger", "--set", "--reconfig", "--flags=perm", f"--program={program} scan")
    slurm.run("strigger", "--set", f"--node={node}", "--drained", f"--program={program} maintenance")
    try:
        t_drain = time.time()
        slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=tmslurm-strigger-test")
        notice = run.wait_for(
            lambda e: e["type"] == "notice" and e.get("node") == node,
            timeout=60,
            what="the notice delivered by strigger",
        )
        print(f"strigger latency (drain -> notice in the journal): {notice['t'] - t_drain:.1f}s")
        assert notice["source"] == "admin" and notice["kind"] == "maintenance" and notice["ranks"] == [1], notice
        assert "strigger scan" in notice["reason"] and "tmslurm-strigger-test" in notice["reason"], notice
        # the script logs the delivery after the run answered: wait for the line, do not race it
        text = _wait_log(slurm, log, f"{node}: maintenance notice delivered under {root}", 30)
        run.wait_for(lambda e: e["type"] == "joined" and e["rank"] == 1, what="rank 1 migrated")
        run.wait_for(lambda e: e["type"] == "node_released" and e["node"] == node, what="node release")
        slurm.wait_for(lambda: node_state(slurm, node) == "drained", 30, what=f"{node} DRAINED")
        # now (not before: a job still held it) the --drained trigger fires; the run no longer uses the node
        text = _wait_log(slurm, log, f"{node}: not used by any tmslurm run under {root}", 40)
        assert "event=maintenance" in text and "ERROR" not in text, text
        st = run.status()
        assert st["mode"] == "running" and st["step"] < LONG_STEPS, st
        assert [r["node"] for r in st["ranks"] if r["rank"] == 1] != [node], st
        assert not [e for e in run.journal() if e["type"] == "notice" and e.get("source") != "admin"]
    finally:
        print(f"--- {log.name}\n{_log(log)}")  # shown by pytest when the test fails
        for tid in _trigger_ids(slurm, str(conf)):
            slurm.run("strigger", "--clear", f"--id={tid}", check=False)
    assert not _trigger_ids(slurm, str(conf))


def test_called_like_slurmctld_unknown_nodes_and_bad_setup(slurm, tmp_path):
    """Minimal environment, hostlist as last argument: nodes no run uses are logged, exit 0."""
    root = tmp_path / "runs"
    root.mkdir()
    conf, log = _conf(tmp_path, root, None, slurm.conf)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    cwd = tmp_path
    r = subprocess.run(
        [str(SCRIPT), "--conf", str(conf), "failure", "node[1-2],gpu07"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    text = _log(log)
    for n in ("node1", "node2", "gpu07"):
        assert f"{n}: not used by any tmslurm run under {root}" in text, text
    # the configuration can also come from the environment; a bad event or no runs root is an error
    r = subprocess.run(
        [str(SCRIPT), "maintenance_typo", "node1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "TMSLURM_STRIGGER_CONF": str(conf)},
        cwd=cwd,
    )
    assert r.returncode == 1 and "first argument must be" in _log(log)
    bad = tmp_path / "bad.conf"
    bad.write_text(f"TMSLURM_PYTHON={sys.executable}\nTMSLURM_STRIGGER_LOG={log}\n")
    r = subprocess.run(
        [str(SCRIPT), "--conf", str(bad), "failure", "node1"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "TMSLURM_RUNS_ROOT is not set" in _log(log)
    assert os.access(SCRIPT, os.X_OK)
