"""What the controller asks of the cluster it runs on: the :class:`ClusterHooks` protocol.

Contract: the controller calls these on its own thread; an implementation never raises into it
(failures are logged) and never blocks for long. :class:`LocalHooks` is the ``cluster=local``
implementation (nothing to do: faults are raised as notices, there is no job to requeue); the
Slurm one is :class:`tmslurm.slurm.hooks.SlurmHooks`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol


class ClusterHooks(Protocol):
    def on_step(self, step: int, nodes: dict[str, str]) -> None:
        """A step committed; ``nodes`` maps every node in use to ``main`` or ``spare``."""

    def release_nodes(self, nodes: list[str], ranks_of_node: Callable[[str], list[int]]) -> list[str]:
        """A switch finished; give back those of ``nodes`` left without ranks. Returns those released."""

    def inject_fault(self, fault: dict[str, Any], fired: Callable[[float, str], None]) -> bool:
        """Raise an injected fault through the cluster (drain/node_down through Slurm, power_off/
        partition through the failure lab); False: raise it as a notice instead. For a fault whose
        moment is only known later, ``fired(t, node)`` is called from any thread when it happened."""

    def is_batch_host(self, node: str | None) -> bool:
        """Remember a noticed node as bad; True when it is the main job's batch host."""

    def requeue(self, exclude: list[str]) -> bool:
        """Requeue the run's own job away from ``exclude``; False when the cluster cannot."""

    def can_requeue(self) -> bool:
        """Whether :meth:`requeue` is possible here."""

    def status(self) -> dict[str, Any]:
        """Cluster facts for ``tmslurm status`` and ``summary.json`` (job ids)."""


class LocalHooks:
    def on_step(self, step: int, nodes: dict[str, str]) -> None:
        return None

    def release_nodes(self, nodes: list[str], ranks_of_node: Callable[[str], list[int]]) -> list[str]:
        return []

    def inject_fault(self, fault: dict[str, Any], fired: Callable[[float, str], None]) -> bool:
        return False

    def is_batch_host(self, node: str | None) -> bool:
        return False

    def requeue(self, exclude: list[str]) -> bool:
        return False

    def can_requeue(self) -> bool:
        return False

    def status(self) -> dict[str, Any]:
        return {"main_job_id": None, "spare_job_ids": []}
