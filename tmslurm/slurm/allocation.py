"""The allocation a main job runs in, checked against the run's layout before anything starts.

Contract: :func:`check_allocation` compares the nodes of the Slurm job this process runs in
(``SLURM_JOB_NUM_NODES``, set by sbatch; ``SLURM_NNODES`` else) with the nodes the layout needs
(:func:`~tmslurm.core.config.num_nodes`). ``tmslurm-launch`` asks Slurm for exactly that many; a job
submitted by hand (``sbatch -N K scripts/tmslurm.sbatch ...``) gets what ``-N`` says. Outside an
allocation (no such variable) it checks nothing and returns None. Failure behaviour: too few nodes
raise :class:`~tmslurm.core.errors.ConfigError` naming ``sbatch -N`` and the overrides to change
(ranks would otherwise be placed on nodes the job does not have); more nodes than needed are allowed
(the extra ones stay idle) and returned so the caller can say so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tmslurm.core.config import RunConfig, num_nodes, world_size
from tmslurm.core.errors import ConfigError


def allocated_nodes(env: Mapping[str, str] | None = None) -> int | None:
    """The node count of the job this process runs in; None outside a Slurm job."""
    env = os.environ if env is None else env
    text = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    return int(text) if text and text.isdigit() else None


def check_allocation(cfg: RunConfig, env: Mapping[str, str] | None = None) -> int | None:
    """The allocation's node count (None outside one); ConfigError when it has fewer than the layout needs."""
    have = allocated_nodes(env)
    need = num_nodes(cfg.parallel)
    if have is not None and have < need:
        p = cfg.parallel
        raise ConfigError(
            f"this job has {have} node(s); the layout needs {need}: parallel.dp*pp*tp = "
            f"{p.dp}*{p.pp}*{p.tp} = {world_size(p)} ranks at parallel.ranks_per_node={p.ranks_per_node}. "
            f"Fix: submit with sbatch -N {need}, or change parallel.dp, parallel.pp, parallel.tp or "
            f"parallel.ranks_per_node so that dp*pp*tp/ranks_per_node <= {have}."
        )
    return have
