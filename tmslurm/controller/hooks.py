"""What the controller asks of the cluster it runs on: the :class:`ClusterHooks` protocol.

Contract: the controller calls these on its own thread; an implementation never raises into it
(failures are logged) and never waits on the cluster: a slow command runs off the caller's thread
and any result the controller needs comes back through a callback that queues an item for it.
:meth:`ClusterHooks.flush` is the one exception, called after the loop ended. :class:`LocalHooks` is the
``cluster=local`` implementation (nothing to do: faults are raised as notices, there is no job to requeue); the Slurm
one is :class:`tmslurm.slurm.proc.hooks.SlurmHooks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tmslurm.wire.messages import FaultSpec


class ClusterHooks(Protocol):
    def on_step(self, step: int, nodes: Callable[[], dict[str, str]]) -> None:
        """A step committed; ``nodes()`` maps every node in use to ``main`` or ``spare``. It walks
        every agent, so a hook calls it only when it needs the map, not at every step."""

    def check_spares(self) -> None:
        """Look at the spare allocations now, without blocking: one that ended is handed back through
        the spawner's lost standbys. Called while the first commit waits for standbys, when no
        committed step (:meth:`on_step`) looks at them."""

    def release_nodes(self, nodes: list[str], released: Callable[[str], None]) -> None:
        """A switch finished and left ``nodes`` without ranks: give them back; ``released(node)``
        is called (from any thread) for each one the cluster took back."""

    def inject_fault(self, fault: FaultSpec, fired: Callable[[float, list[str]], None]) -> bool:
        """Raise an injected fault on the nodes of ``fault.ranks`` through the cluster (drain/node_down
        through Slurm, power_off/partition/throttle/slowlink through the failure lab, one command for
        all nodes); False: raise it as notices instead. For a fault whose moment is only known later,
        ``fired(t, nodes)`` is called from any thread when it happened."""

    def is_batch_host(self, node: str | None) -> bool:
        """Remember a noticed node as bad; True when it is the main job's batch host."""

    def node_lost(self, node: str) -> None:
        """Remember a node found dead (its monitor and processes silent) as bad, so that nothing
        started from now on (a restarted rank, a spare) lands there before it is healthy again."""

    def expiring_standbys(self, now: float) -> list[int]:
        """The standby ids whose allocation's time limit is within ``slurm.spare_renew_s`` of ``now``
        (Unix time), each allocation named once; no cluster command (the answer is what is known)."""

    def waiting_ranks(self) -> dict[int, float]:
        """Ranks of a restart that wait for an allocation to start on (a spare job still queued or
        starting), with how long they have waited (s); the hook looks for started spares meanwhile."""

    def requeue(self, exclude: list[str]) -> bool:
        """Requeue the run's own job away from ``exclude`` (sent in the background; :meth:`flush`
        waits for it); False when the cluster cannot."""

    def resubmit(self) -> bool:
        """Submit the run's next job, to start once this one has ended, in the same run directory
        (sent in the background; :meth:`flush` waits for it); False when the cluster cannot."""

    def flush(self, timeout_s: float) -> bool:
        """After the loop ended: wait up to ``timeout_s`` for cluster commands still running."""

    def can_requeue(self) -> bool:
        """Whether :meth:`requeue` is possible here."""

    def status(self) -> dict[str, Any]:
        """Cluster facts for ``tmslurm status`` and ``summary.json`` (job ids)."""


class LocalHooks:
    def on_step(self, step: int, nodes: Callable[[], dict[str, str]]) -> None:
        return None

    def check_spares(self) -> None:
        return None

    def release_nodes(self, nodes: list[str], released: Callable[[str], None]) -> None:
        return None

    def inject_fault(self, fault: FaultSpec, fired: Callable[[float, list[str]], None]) -> bool:
        return False

    def is_batch_host(self, node: str | None) -> bool:
        return False

    def node_lost(self, node: str) -> None:
        return None

    def expiring_standbys(self, now: float) -> list[int]:
        return []

    def waiting_ranks(self) -> dict[int, float]:
        return {}

    def requeue(self, exclude: list[str]) -> bool:
        return False

    def resubmit(self) -> bool:
        return False

    def flush(self, timeout_s: float) -> bool:
        return True

    def can_requeue(self) -> bool:
        return False

    def status(self) -> dict[str, Any]:
        return {"main_job_id": None, "spare_job_ids": []}
