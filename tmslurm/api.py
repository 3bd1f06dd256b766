"""The Python API: compose a config, launch a run and follow it, send an admin notice.

Contract:
- :func:`compose` is ``tmslurm-launch``'s config composition: Hydra overrides in, a validated
  :class:`~tmslurm.core.config.RunConfig` out; a bad override raises
  :class:`~tmslurm.core.errors.ConfigError` naming it.
- :func:`launch` takes a config (validated again) or overrides and starts the run, returning a
  :class:`Run` at once. ``cluster=local``: the run directory is written here and the launcher runs it
  in a child process (``tmslurm-launch --prepared``), its output in ``<run_dir>/logs/launch.log``.
  ``cluster=slurm``: the main job is submitted (:func:`~tmslurm.slurm.proc.job.launch_slurm`) and the
  run goes on in Slurm. Errors before anything started raise TmslurmError.
- :meth:`Run.status` is ``tmslurm status``'s :class:`~tmslurm.cli.run_status.RunStatus`;
  :meth:`Run.wait` returns the run's :class:`~tmslurm.core.results.Summary` once ``summary.json``
  exists (and, locally, the launcher exited). It raises :class:`WaitTimeout` when ``timeout`` seconds
  pass first (the run goes on), TmslurmError naming the launcher's log when a local launcher exited
  without a summary, and TmslurmError naming ``summary.json`` when that is malformed.
- :func:`notify` is ``tmslurm notify``: it sends one admin notice to every run using ``node`` (or to
  ``run_dirs``), returns one line per run, and raises NoticeError/AuthError as that command does.
Nothing here imports torch; the runs do, in their own processes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tmslurm.core.config import RunConfig, compose_config, validate
from tmslurm.core.config.site import apply_site_defaults
from tmslurm.core.errors import TmslurmError
from tmslurm.core.results import Summary, load_summary
from tmslurm.core.rundir import RunDir

POLL_S = 0.2
"""How often :meth:`Run.wait` looks for ``summary.json``."""


class WaitTimeout(TmslurmError, TimeoutError):
    """:meth:`Run.wait` ran out of time; the run goes on."""


def compose(overrides: Sequence[str] = ()) -> RunConfig:
    """The validated config of ``overrides`` (Hydra's ``key=value``), as ``tmslurm-launch`` composes it."""
    return compose_config(list(overrides))


class Run:
    """A launched run: its directory, and for a local run the launcher's process."""

    def __init__(self, run_dir: Path, proc: subprocess.Popen | None = None, job_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.proc = proc
        """The local launcher (None on Slurm)."""
        self.job_id = job_id
        """The Slurm main job's id (None for a local run)."""

    def __repr__(self) -> str:
        where = f"job {self.job_id}" if self.job_id else "local"
        return f"Run({str(self.run_dir)!r}, {where})"

    @property
    def log(self) -> Path:
        """The local launcher's output."""
        return RunDir(self.run_dir).log("launch")

    def status(self, timeout_s: float = 10.0):  # -> RunStatus (imported lazily with the CLI)
        """The run's status now (:class:`~tmslurm.cli.run_status.RunStatus`): from its controller, or
        from its summary once it finished; TmslurmError when neither answers."""
        from tmslurm.cli.run_status import RunStatus, fetch

        return RunStatus.from_dict(fetch(self.run_dir, None, timeout_s=timeout_s))

    def done(self) -> bool:
        """Whether the run has finished (its summary exists)."""
        return RunDir(self.run_dir).summary.is_file()

    def wait(self, timeout: float | None = None) -> Summary:
        """The run's summary, once it finished (see the module's contract)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        summary = RunDir(self.run_dir).summary
        while not summary.is_file():
            if self.proc is not None and self.proc.poll() is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"run {self.run_dir} did not finish within {timeout:g} s (it goes on)")
            time.sleep(POLL_S)
        if self.proc is not None:
            self._reap(self.proc, deadline)
        return load_summary(summary)

    def _reap(self, proc: subprocess.Popen, deadline: float | None) -> None:
        """Wait for the local launcher, which exits right after the summary is written."""
        try:
            rc = proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise WaitTimeout(f"run {self.run_dir}: its launcher has not exited yet (it goes on)") from None
        if not RunDir(self.run_dir).summary.is_file():
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.is_file() else ""
            raise TmslurmError(
                f"run {self.run_dir}: the launcher exited {rc} without a summary; see {self.log}\n{tail}"
            )


def launch(cfg_or_overrides: RunConfig | Sequence[str] = ()) -> Run:
    """Start a run from a config or from overrides; its :class:`Run` (see the module's contract)."""
    if isinstance(cfg_or_overrides, RunConfig):
        cfg = validate(cfg_or_overrides)
        apply_site_defaults(cfg)  # as composition does: the site's admin public key when none is set
    else:
        cfg = compose(cfg_or_overrides)
    if cfg.cluster == "slurm":
        from tmslurm.slurm.proc.job import launch_slurm

        job_id = launch_slurm(cfg)
        return Run(Path(cfg.run_dir), job_id=job_id)
    from tmslurm.cli.launch import prepare_local

    run_dir = prepare_local(cfg)
    log = RunDir(run_dir).log("launch")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tmslurm.cli.launch", "--prepared", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Run(run_dir, proc=proc)


def notify(
    node: str | None = None,
    *,
    event: str = "maintenance",
    rank: int | None = None,
    run_dirs: Sequence[Path | str] = (),
    runs_root: Path | str = "runs",
    deadline: str | None = None,
    reason: str = "",
    token: str | None = None,
    private_key_file: Path | str | None = None,
    timeout_s: float = 10.0,
) -> list[str]:
    """Send an admin notice (``event``: ``maintenance`` or ``failure``) about ``node`` (or ``rank`` of
    the one run in ``run_dirs``) to the runs using it, as ``tmslurm notify`` does; one line per run.
    Raises :class:`TmslurmError` as ``tmslurm notify`` exits non-zero: when no run accepted it, or
    when a live run did not get it (the error lists those runs)."""
    from tmslurm.cli.notify import notify as send

    args = argparse.Namespace(
        node=node,
        rank=rank,
        event=event,
        deadline=deadline,
        reason=reason,
        run_dir=[str(d) for d in run_dirs] or None,
        runs_root=str(runs_root),
        token=token,
        private_key_file=None if private_key_file is None else str(private_key_file),
        timeout=timeout_s,
    )
    delivery = send(args)
    problem = delivery.problem()
    if problem is not None:
        raise problem
    return delivery.lines
