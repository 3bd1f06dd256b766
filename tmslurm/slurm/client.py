"""The Slurm client interface, its command-line backend, and the choice of backend.

Contract:
- :class:`SlurmClient` is what the rest of tmslurm uses: node states, a job, a job's run record
  (``job_record``: multi-line ``scontrol show job``, where ``Comment=`` sits alone on its line;
  ``accounted_job``: ``sacct -X``), reservations,
  accounting rows, submit, cancel, shrink a job (``update_job_nodelist``), update a node, version.
- :class:`CliSlurmClient` runs Slurm's commands with a timeout and parses their *classic* text
  output with :mod:`tmslurm.slurm.parse` (not ``--json``: in 22.05 ``--json`` ignores filters and
  its schema differs in 24.11). Its subprocesses always get ``SLURM_TIME_FORMAT=standard`` so
  times parse the same everywhere.
- Failures: a missing command, a non-zero exit or a timeout raise
  :class:`~tmslurm.core.errors.SlurmError` with the command line, the exit code, the tail of stderr and
  a hint; unparseable output raises :class:`~tmslurm.core.errors.SlurmParseError` (a SlurmError).
  Expected "absent" answers are not errors: ``job()`` of an unknown job is None, ``nodes(names)``
  skips names Slurm does not know (logged), empty outputs are empty lists.
- :func:`make_client` picks the pyslurm backend only when pyslurm is importable and built for the
  running Slurm's major.minor, otherwise the CLI backend, and logs which one and why.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

from tmslurm.core.errors import ConfigError, SlurmError
from tmslurm.slurm import parse
from tmslurm.slurm.api import HINT, SlurmClient
from tmslurm.slurm.parse import JobInfo, NodeInfo, Reservation
from tmslurm.slurm.runtag import SACCT_RECORD_FIELDS, JobRecord, parse_job_record, parse_sacct_record

__all__ = ["HINT", "BACKENDS", "CliSlurmClient", "SlurmClient", "make_client"]

log = logging.getLogger(__name__)

SACCT_FIELDS = "JobID,JobName,State,NodeList,ExitCode,Start,End,Elapsed"
BACKENDS = ("auto", "cli", "pyslurm")
_TAIL_CHARS = 400
_NOT_FOUND = re.compile(r"^Node (\S+) not found$")


class CliSlurmClient(SlurmClient):
    """SlurmClient over scontrol/sinfo/sacct/sbatch/scancel.

    ``env`` entries are added to this process's environment (read at each call) for the commands (e.g. a PATH or
    SLURM_CONF for a local test cluster); ``SLURM_TIME_FORMAT`` is always ``standard``.
    """

    def __init__(self, timeout_s: float = 10.0, env: Mapping[str, str] | None = None):
        if timeout_s <= 0:
            raise ConfigError(f"Slurm command timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._extra_env = dict(env or {})

    def __repr__(self) -> str:
        return f"CliSlurmClient(timeout_s={self.timeout_s})"

    # -- queries ---------------------------------------------------------------------------------

    def nodes(self, names: Sequence[str] | None = None) -> list[NodeInfo]:
        if names is not None and not names:
            return []
        args = ["scontrol", "-o", "show", "node"]
        if names:
            args.append(parse.compress_hostlist(names))
        proc = self._run(args, ok_codes=(0, 1))
        text = self._drop_not_found(args, proc)
        return parse.parse_nodes(text, cmd=shlex.join(args))

    def job(self, job_id: str | int) -> JobInfo | None:
        args = ["scontrol", "-o", "show", "job", str(job_id)]
        proc = self._run(args, ok_codes=(0, 1))
        if proc.returncode == 1:
            if "invalid job id" in proc.stderr.lower():
                return None
            raise self._failed(args, proc)
        jobs = parse.parse_jobs(proc.stdout, cmd=shlex.join(args))
        match = [j for j in jobs if j.job_id == str(job_id)]
        found = match or jobs
        return found[0] if found else None

    def job_record(self, job_id: str | int) -> JobRecord | None:
        args = ["scontrol", "show", "job", str(job_id)]
        proc = self._run(args, ok_codes=(0, 1))
        if proc.returncode == 1:
            if "invalid job id" in proc.stderr.lower():
                return None
            raise self._failed(args, proc)
        return parse_job_record(proc.stdout, str(job_id), cmd=shlex.join(args))

    def accounted_job(self, job_id: str | int) -> JobRecord | None:
        args = ["sacct", "-X", "-j", str(job_id), "--parsable2", "-o", ",".join(SACCT_RECORD_FIELDS)]
        return parse_sacct_record(self._run(args).stdout, str(job_id), cmd=shlex.join(args))

    def reservations(self) -> list[Reservation]:
        args = ["scontrol", "-o", "show", "res"]
        return parse.parse_reservations(self._run(args).stdout, cmd=shlex.join(args))

    def sacct(self, job_id: str | int) -> list[dict[str, str]]:
        args = ["sacct", "-j", str(job_id), "--parsable2", "-o", SACCT_FIELDS]
        return parse.parse_sacct(self._run(args).stdout, cmd=shlex.join(args))

    def version(self) -> str:
        args = ["sinfo", "--version"]
        return parse.parse_version(self._run(args).stdout, cmd=shlex.join(args))

    # -- actions ---------------------------------------------------------------------------------

    def submit(self, script_path: str | os.PathLike, args: Sequence[str], script_args: Sequence[str] = ()) -> str:
        cmd = ["sbatch", "--parsable", *args, str(script_path), *script_args]
        return parse.parse_sbatch_parsable(self._run(cmd).stdout, cmd=shlex.join(cmd))

    def cancel(self, job_id: str | int) -> None:
        self._run(["scancel", str(job_id)])

    def update_job_nodelist(self, job_id: str | int, nodes: Sequence[str]) -> None:
        if not nodes:
            raise SlurmError(f"refusing to shrink job {job_id} to no nodes; cancel it instead")
        args = ["scontrol", "update", f"jobid={job_id}", f"nodelist={parse.compress_hostlist(nodes)}"]
        # scontrol writes slurm_job_<id>_resize.{sh,csh} into its working directory: keep it out of ours.
        with tempfile.TemporaryDirectory(prefix="tmslurm-resize-") as scratch:
            self._run(args, cwd=scratch)

    def update_job_excludes(self, job_id: str | int, nodes: Sequence[str]) -> None:
        self._run(
            ["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={parse.compress_hostlist(nodes) if nodes else ''}"]
        )

    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        args = ["scontrol", "update", f"nodename={name}", f"state={state}"]
        if reason is not None:
            args.append(f"reason={reason}")
        self._run(args)

    # -- process handling ------------------------------------------------------------------------

    def _environ(self) -> dict[str, str]:
        return {**os.environ, **self._extra_env, "SLURM_TIME_FORMAT": "standard"}

    def _run(
        self, args: list[str], ok_codes: tuple[int, ...] = (0,), cwd: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run ``args``; raise SlurmError for a missing command, a timeout or an exit not in ok_codes."""
        log.debug("running %s", shlex.join(args))
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self._environ(),
                cwd=cwd,
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise SlurmError(
                f"`{shlex.join(args)}` could not start ({exc.strerror}: "
                f"{args[0]!r} not found or not executable on PATH); {HINT}"
            ) from None
        with proc:
            try:
                out, err = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise SlurmError(
                    f"`{shlex.join(args)}` timed out after {self.timeout_s:g}s (timeout_s); {HINT}"
                ) from None
        done = subprocess.CompletedProcess(args, proc.returncode, out, err)
        if done.returncode not in ok_codes:
            raise self._failed(args, done)
        return done

    @staticmethod
    def _failed(args: list[str], proc: subprocess.CompletedProcess) -> SlurmError:
        tail = (proc.stderr.strip() or proc.stdout.strip() or "(no output)")[-_TAIL_CHARS:]
        return SlurmError(f"`{shlex.join(args)}` failed with exit code {proc.returncode}: {tail}; {HINT}")

    def _drop_not_found(self, args: list[str], proc: subprocess.CompletedProcess) -> str:
        """stdout without scontrol's ``Node X not found`` lines; raise if exit 1 had another cause."""
        kept, missing = [], []
        for line in proc.stdout.splitlines():
            m = _NOT_FOUND.match(line.strip())
            if m:
                missing.append(m.group(1))
            else:
                kept.append(line)
        if proc.returncode != 0 and not missing:
            raise self._failed(args, proc)
        if missing:
            log.warning("Slurm does not know node(s) %s; skipped", parse.compress_hostlist(missing))
        return "\n".join(kept)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the timed-out command and anything it started (it leads its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.communicate()


def make_client(prefer: str = "auto", *, timeout_s: float = 10.0, env: Mapping[str, str] | None = None) -> SlurmClient:
    """The pyslurm backend when asked for (``pyslurm``/``auto``) and usable, else the CLI backend.

    ``prefer="pyslurm"`` falls back to the CLI too (with a warning) when pyslurm is missing or
    built for another Slurm release: the CLI backend always works where Slurm's commands do.
    """
    if prefer not in BACKENDS:
        raise ConfigError(
            f"unknown Slurm client backend {prefer!r}; valid: {', '.join(BACKENDS)} (override slurm.client=...)"
        )
    cli = CliSlurmClient(timeout_s=timeout_s, env=env)
    if prefer == "cli":
        log.info("Slurm client: CLI backend (asked for)")
        return cli
    from tmslurm.slurm import pyslurm_backend

    ok, why = pyslurm_backend.available(cli)
    if ok:
        log.info("Slurm client: pyslurm backend (%s)", why)
        return pyslurm_backend.PyslurmClient(cli)
    level = logging.WARNING if prefer == "pyslurm" else logging.INFO
    log.log(level, "Slurm client: CLI backend (pyslurm not used: %s)", why)
    return cli
