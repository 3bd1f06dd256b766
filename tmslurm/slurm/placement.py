"""Where a run's jobs may run: the main job's placement, inherited by its spares and its next job.

Contract:
- :func:`placement_of` reads the fields of the running main job (``scontrol -o show job``: its
  ``Partition``, ``Account``, ``QOS``, ``Features`` and ``TresPerNode``) into a :class:`Placement`.
  A field Slurm prints as ``(null)`` or ``N/A``, or leaves out, stays unset. So a job submitted
  with ``sbatch -p gpu -A proj -q high -C h100 --gres=gpu:8 scripts/tmslurm.sbatch ...`` gets its
  spares in the same partition, under the same account and QOS, with the same features and GRES,
  whatever ``slurm.*`` says.
- :func:`placement_from_config` is the placement of a first submission (``slurm.partition``,
  ``slurm.account``); the other fields come from ``slurm.extra_args`` there.
- :meth:`Placement.sbatch_params` gives submitit's ``slurm_additional_parameters`` for it.
- Spares are always ``--exclusive``, inherited or not: a spare that shared a node with a rank would
  fail with it.
- Pure: no Slurm call and nothing raised. An unreadable ``TresPerNode`` entry is dropped with a
  warning, never guessed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tmslurm.core.config import RunConfig

log = logging.getLogger(__name__)
UNSET = ("", "(null)", "N/A", "None")


@dataclass(frozen=True, kw_only=True)
class Placement:
    partition: str | None = None
    """sbatch --partition."""
    account: str | None = None
    """sbatch --account."""
    qos: str | None = None
    """sbatch --qos."""
    constraint: str | None = None
    """sbatch --constraint (the job's ``Features``)."""
    gres: str | None = None
    """sbatch --gres, per node (``gpu:8``; several comma-separated)."""

    def sbatch_params(self) -> dict[str, Any]:
        """The set fields as submitit's additional parameters (the partition goes separately)."""
        out = {"account": self.account, "qos": self.qos, "constraint": self.constraint, "gres": self.gres}
        return {k: v for k, v in out.items() if v is not None}

    def describe(self) -> str:
        fields = {"partition": self.partition, **self.sbatch_params()}
        return " ".join(f"{k}={v}" for k, v in fields.items() if v is not None) or "(cluster defaults)"


def _field(raw: Mapping[str, str], key: str) -> str | None:
    value = raw.get(key, "").strip()
    return None if value in UNSET else value


def _gres(tres_per_node: str | None) -> str | None:
    """``gres:gpu:8`` (Slurm 22.05) or ``gres/gpu:8`` (23.02 and later), comma-separated -> ``gpu:8``."""
    if tres_per_node is None:
        return None
    out = []
    for item in tres_per_node.split(","):
        kind, sep, rest = item.partition(":") if item.startswith("gres:") else item.partition("/")
        if kind != "gres" or not sep or not rest:
            log.warning("ignoring TresPerNode entry %r: not a GRES this run knows how to ask for again", item)
            continue
        out.append(rest)
    return ",".join(out) or None


def placement_of(raw: Mapping[str, str]) -> Placement:
    """The placement of a job from its ``scontrol show job`` fields."""
    return Placement(
        partition=_field(raw, "Partition"),
        account=_field(raw, "Account"),
        qos=_field(raw, "QOS"),
        constraint=_field(raw, "Features"),
        gres=_gres(_field(raw, "TresPerNode")),
    )


def placement_from_config(cfg: RunConfig) -> Placement:
    return Placement(partition=cfg.slurm.partition or None, account=cfg.slurm.account or None)
