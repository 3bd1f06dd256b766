"""The public API (:mod:`tmslurm.api`): ``tmslurm.__all__`` lists it, ``import tmslurm`` stays cheap
(no torch), and the README's Python example runs as written on a tiny local run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tmslurm

README = Path(__file__).resolve().parents[2] / "README.md"
API = {"compose", "launch", "notify", "Run", "Summary", "Event", "RunConfig", "Task", "StageSpec", "TmslurmError"}


def test_all_lists_the_api_and_every_name_resolves():
    assert API <= set(tmslurm.__all__)
    assert set(tmslurm.__all__) == {"__version__", *tmslurm._HOMES}
    for name in tmslurm.__all__:
        assert getattr(tmslurm, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tmslurm.nope  # noqa: B018


def test_import_tmslurm_imports_no_torch():
    code = (
        "import sys, tmslurm; from tmslurm import launch, compose, Summary; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'hydra')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_compose_refuses_a_bad_override_naming_it():
    with pytest.raises(tmslurm.ConfigError, match="parallel.dp"):
        tmslurm.compose(["parallel.dp=0"])


def test_wait_without_a_summary_times_out_and_the_run_goes_on(tmp_path):
    run = tmslurm.Run(tmp_path)
    with pytest.raises(tmslurm.WaitTimeout, match="did not finish"):
        run.wait(timeout=0.0)
    assert not run.done()


def readme_example() -> str:
    """The first ```python block of the README's "Python API" section."""
    text = README.read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    (code, *_) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


@pytest.mark.dist
def test_the_readme_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the example's run lands in ./runs/<time>
    scope: dict = {}
    exec(compile(readme_example(), str(README), "exec"), scope)
    summary, run = scope["summary"], scope["run"]
    assert isinstance(summary, tmslurm.Summary)
    assert summary.steps == 6 and summary.layout.dp == 2 and summary.events == []
    assert summary.final_params_sha256 and summary.loss_last < summary.loss_first
    assert run.run_dir.parent == tmp_path / "runs" and run.done() and run.proc.returncode == 0
    assert run.status().finished
    out = capsys.readouterr().out
    assert f"{run.run_dir}: 6 steps" in out and summary.final_params_sha256 in out


def test_launch_refuses_a_finished_run_directory_before_starting_anything(tmp_path):
    cfg = tmslurm.compose(["cluster=local", "model=tiny", f"run_dir={tmp_path}"])
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(tmslurm.TmslurmError, match="already holds a finished run"):
        tmslurm.launch(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_notify_without_a_live_run_says_where_it_looked(tmp_path):
    with pytest.raises(tmslurm.TmslurmError, match="no live tmslurm run found"):
        tmslurm.notify("node1", runs_root=tmp_path)
