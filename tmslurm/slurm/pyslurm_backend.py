"""Optional pyslurm backend of :class:`~tmslurm.slurm.client.SlurmClient` (queries only).

Contract:
- :func:`available` says whether pyslurm can be used here, and why not: pyslurm missing, failing
  to import (e.g. no matching ``libslurm``), or built for another Slurm major.minor than the one
  ``sinfo --version`` reports (each pyslurm release is tied to one Slurm release; PyPI only
  carries 25.11 now, which does not talk to a 22.05 or 24.11 controller). It never raises.
- :class:`PyslurmClient` reads nodes, a job and reservations through pyslurm and delegates every
  other method (job_record, accounted_job, sacct, submit, cancel, update_job_nodelist, update_job_excludes, update_node,
  version) to the CLI backend it is given. pyslurm failures become :class:`~tmslurm.core.errors.SlurmError`.

API mapping (pyslurm >= 23.2 "new" API, read from the pyslurm sources; NOT exercised against a
live controller here, since no pyslurm build matching the local Slurm exists on this machine):

=====================  ==========================================================================
tmslurm                pyslurm
=====================  ==========================================================================
nodes(names)           ``pyslurm.Nodes.load()`` (a dict-like map name -> Node); ``Node.name``,
                       ``Node.state`` (``slurm_node_state_string_complete``: "IDLE+DRAIN", the
                       same text as scontrol's State=), ``Node.reason``
job(id)                ``pyslurm.Job.load(id)``; ``.id``, ``.state``, ``.state_reason``,
                       ``.allocated_nodes`` (hostlist), ``.batch_host``, ``.requeue_count``,
                       ``.is_requeueable``; an unknown id raises ``pyslurm.RPCError``
reservations()         ``pyslurm.Reservations.load()`` (newer pyslurm only; otherwise the CLI);
                       ``.name``, ``.start_time``/``.end_time`` (epoch), ``.nodes`` (hostlist),
                       ``.flags`` (``ReservationFlags``; MAINTENANCE -> "MAINT")
=====================  ==========================================================================
"""

from __future__ import annotations

import enum
import importlib
import logging
import os
from collections.abc import Sequence
from datetime import datetime
from types import ModuleType

from tmslurm.core.errors import SlurmError
from tmslurm.slurm import parse
from tmslurm.slurm.api import HINT, SlurmClient
from tmslurm.slurm.parse import JobInfo, NodeInfo, Reservation
from tmslurm.slurm.runtag import JobRecord

log = logging.getLogger(__name__)

_FLAG_NAMES = {"MAINTENANCE": "MAINT"}


def _major_minor(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


def available(version_source: SlurmClient) -> tuple[bool, str]:
    """(True, why) when pyslurm imports and matches ``version_source.version()``'s major.minor."""
    try:
        module = importlib.import_module("pyslurm")
    except ImportError as exc:
        return False, f"pyslurm is not installed ({exc}); install the release matching your Slurm"
    except Exception as exc:  # e.g. OSError: libslurm.so.NN not found
        return False, f"pyslurm failed to import: {exc!r}"
    py_version = getattr(module, "__version__", "")
    if not py_version:
        return False, "pyslurm has no __version__; cannot tell which Slurm it was built for"
    try:
        slurm_version = version_source.version()
    except SlurmError as exc:
        return False, f"cannot read the Slurm version to compare with pyslurm {py_version}: {exc}"
    if _major_minor(py_version) != _major_minor(slurm_version):
        return False, (
            f"pyslurm {py_version} is built for Slurm {_major_minor(py_version)}, "
            f"but this cluster runs Slurm {slurm_version}"
        )
    return True, f"pyslurm {py_version} matches Slurm {slurm_version}"


class PyslurmClient(SlurmClient):
    """Queries through pyslurm, everything else through ``cli``. Build it via ``make_client``."""

    def __init__(self, cli: SlurmClient, module: ModuleType | None = None):
        self._cli = cli
        self._pyslurm = module or importlib.import_module("pyslurm")
        self._rpc_error = getattr(self._pyslurm, "RPCError", RuntimeError)

    def nodes(self, names: Sequence[str] | None = None) -> list[NodeInfo]:
        loaded = self._call("Nodes.load()", self._pyslurm.Nodes.load)
        wanted = None if names is None else set(names)
        return [_node_info(n) for n in loaded.values() if wanted is None or n.name in wanted]

    def job(self, job_id: str | int) -> JobInfo | None:
        try:
            job = self._pyslurm.Job.load(int(job_id))
        except self._rpc_error as exc:
            if "invalid job id" in str(exc).lower():
                return None
            raise SlurmError(f"pyslurm Job.load({job_id}) failed: {exc}; {HINT}") from None
        node_list = job.allocated_nodes or ""
        return JobInfo(
            job_id=str(job.id),
            state=str(job.state),
            node_list=node_list,
            nodes=parse.expand_hostlist(node_list),
            batch_host=job.batch_host or None,
            restarts=int(job.requeue_count or 0),
            requeue=bool(job.is_requeueable),
            reason=job.state_reason or "",
        )

    def job_record(self, job_id: str | int) -> JobRecord | None:
        return self._cli.job_record(job_id)

    def accounted_job(self, job_id: str | int) -> JobRecord | None:
        return self._cli.accounted_job(job_id)

    def reservations(self) -> list[Reservation]:
        if not hasattr(self._pyslurm, "Reservations"):
            return self._cli.reservations()
        loaded = self._call("Reservations.load()", self._pyslurm.Reservations.load)
        return [_reservation(r) for r in loaded.values()]

    def sacct(self, job_id: str | int) -> list[dict[str, str]]:
        return self._cli.sacct(job_id)

    def submit(self, script_path: str | os.PathLike, args: Sequence[str], script_args: Sequence[str] = ()) -> str:
        return self._cli.submit(script_path, args, script_args)

    def cancel(self, job_id: str | int) -> None:
        self._cli.cancel(job_id)

    def update_job_nodelist(self, job_id: str | int, nodes: Sequence[str]) -> None:
        self._cli.update_job_nodelist(job_id, nodes)

    def update_job_excludes(self, job_id: str | int, nodes: Sequence[str]) -> None:
        self._cli.update_job_excludes(job_id, nodes)

    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        self._cli.update_node(name, state, reason)

    def version(self) -> str:
        return self._cli.version()

    def _call(self, what: str, fn):
        try:
            return fn()
        except self._rpc_error as exc:
            raise SlurmError(f"pyslurm {what} failed: {exc}; {HINT}") from None


def _node_info(node) -> NodeInfo:
    state = str(node.state)
    try:
        base, flags = parse.parse_state(state)
    except ValueError:
        raise parse.parse_error("pyslurm Nodes.load()", f"{node.name}: {state}", "bad node state") from None
    return NodeInfo(node.name, state, base, flags, node.reason or "")


def _reservation(resv) -> Reservation:
    node_list = resv.nodes or ""
    return Reservation(
        resv.name,
        datetime.fromtimestamp(resv.start_time),
        datetime.fromtimestamp(resv.end_time),
        parse.expand_hostlist(node_list),
        frozenset(_flag_names(resv.flags)),
        node_list,
    )


def _flag_names(flags) -> list[str]:
    if not flags:
        return []
    if isinstance(flags, str):
        names = flags.split(",")
    elif isinstance(flags, enum.Flag):
        names = [m.name for m in type(flags) if m in flags and m.name]
    else:
        names = [getattr(f, "name", str(f)) for f in flags]
    return [_FLAG_NAMES.get(n.strip().upper(), n.strip().upper()) for n in names if n.strip()]
