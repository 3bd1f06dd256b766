"""Switch planning: which groups to rebuild, who joins, who sends state, what each process is told.

Contract: pure functions over the layout and the reports of the ranks; no I/O. They decide

- the *affected* groups (those containing a leaving or dead rank) and the *dirty* groups (an aborted
  step left them inconsistent: a pending operation, unequal collective counts, unmatched sends and
  receives, or members on different generations); every other group is reused as is;
- a state source for each dead rank (an alive data-parallel peer; at ``parallel.zero=1`` the rank's
  buddy, which holds the only other copy of its optimizer slice) and a warm joiner per move;
- the per-process messages of a planned switch (``prepare``/``join``) and of a recovery
  (``recover``/``join``).

When a plan is impossible (no warm standby for a role, no alive DP peer) :class:`PlanError` says
why, and the controller falls back to a checkpoint restart.
"""

from __future__ import annotations

from collections.abc import Iterable

from tmslurm.controller.plan_types import AnyPlan, Move
from tmslurm.core.errors import TmslurmError
from tmslurm.core.topology import Layout
from tmslurm.wire.messages import Join, Prepare, Recover


class PlanError(TmslurmError):
    """No switch is possible; the message says why (the controller falls back to a restart)."""


def multi(layout: Layout, names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if len(layout.groups[n].members) > 1)


def dirty_groups(layout: Layout, statuses: dict[int, dict[str, dict[str, int]]]) -> set[str]:
    """Groups an aborted step left inconsistent, judged from every alive member's op counts."""
    dirty: set[str] = set()
    for name, spec in layout.groups.items():
        rows = {r: statuses[r][name] for r in spec.members if r in statuses and name in statuses[r]}
        if len(rows) < len(spec.members) or len(spec.members) < 2:
            continue  # a group with a dead member is affected anyway
        if any(row["pending"] for row in rows.values()):
            dirty.add(name)
        elif len({row["coll"] for row in rows.values()}) > 1 or len({row.get("gen") for row in rows.values()}) > 1:
            dirty.add(name)
        elif name.startswith("pp/"):
            a, b = spec.members
            if rows[a]["sent"] != rows[b]["recv"] or rows[b]["sent"] != rows[a]["recv"]:
                dirty.add(name)
    return dirty


def dp_source(layout: Layout, rank: int, dead: set[int]) -> int:
    """An alive data-parallel peer of ``rank`` holding the same stage (its state is identical); at
    ``parallel.zero=1`` its buddy, the only other holder of its optimizer slice."""
    if layout.zero:
        buddy = layout.buddy(rank)
        if buddy in dead:
            raise PlanError(
                f"rank {rank} and its buddy rank {buddy} are both lost (parallel.zero=1): the optimizer "
                f"slice they held exists nowhere else"
            )
        return buddy
    for peer in layout.groups[layout.dp_group(rank)].members:
        if peer != rank and peer not in dead:
            return peer
    raise PlanError(
        f"rank {rank} has no alive data-parallel peer (dp={layout.dp}): its stage state exists nowhere else"
    )


def pick_joiners(
    layout: Layout, ranks: list[int], pool: dict[str, set[str]], nodes: dict[str, str] | None = None
) -> list[Move]:
    """One warm standby per rank; ``pool`` maps standby id -> shape classes it has warmed (``Layout.roles``).

    With ``nodes`` (standby id -> node), ranks that leave together are placed on one spare node
    when one node's standbys can take them all (a drained node moves to a spare node in one switch).
    """
    nodes = nodes or {}
    for node in sorted(set(nodes.values())):
        try:
            return _greedy(layout, ranks, {k: v for k, v in pool.items() if nodes.get(k) == node}, pool)
        except PlanError:
            continue
    return _greedy(layout, ranks, pool, pool)


def _greedy(layout: Layout, ranks: list[int], candidates: dict[str, set[str]], pool: dict[str, set[str]]) -> list[Move]:
    free = dict(candidates)
    moves: list[Move] = []
    for rank in ranks:
        role = layout.shape_class(rank).name
        choice = next((sid for sid, roles in sorted(free.items()) if role in roles), None)
        if choice is None:
            taken = f" ({', '.join(f'{m.joiner} taken by rank {m.rank}' for m in moves)})" if moves else ""
            raise PlanError(
                f"no warm standby for role {role!r} (rank {rank}); standbys: "
                + (", ".join(f"{k}:{sorted(v)}" for k, v in sorted(pool.items())) or "none")
                + taken
            )
        del free[choice]
        moves.append(Move(rank=rank, joiner=choice))
    return moves


def planned_messages(layout: Layout, plan: AnyPlan, shadow: bool = False) -> dict[int | str, Prepare | Join]:
    """``prepare`` for stayers (keyed by rank) and leavers, ``join`` for joiners (keyed by standby id);
    with ``shadow`` the leavers feed and the joiners follow a live shadow."""
    leaving = set(plan.ranks)
    groups: dict[int, dict[str, int]] = {}
    pairs: dict[int, dict[str, list[int]]] = {}
    for name in plan.groups:
        for member in layout.groups[name].members:
            if member not in leaving:
                groups.setdefault(member, {})[name] = plan.epoch
    for m in plan.moves:
        pairs.setdefault(m.rank, {})[m.xfer] = [plan.epoch, 0]
    out: dict[int | str, Prepare | Join] = {
        r: Prepare(epoch=plan.epoch, groups=groups.get(r, {}), pairs=pairs.get(r, {}), shadow=shadow and r in pairs)
        for r in [*groups, *(r for r in pairs if r not in groups)]
    }
    for m in plan.moves:
        out[m.joiner] = join_message(layout, plan, m, activate=False).model_copy(update={"shadow": shadow})
    return out


def recovery_messages(
    layout: Layout, plan: AnyPlan, alive: list[int], hold: bool = False
) -> dict[int | str, Recover | Join]:
    """``recover`` for every alive rank (possibly with nothing to rebuild) and ``join`` per joiner.
    ``hold``: while state travels to joiners, the ranks that send none wait for ``resume``."""
    pairs: dict[int, dict[str, list[int]]] = {rank: {} for rank in alive}
    for m in plan.moves:
        assert m.source is not None, f"rank {m.rank}'s move in a recovery names no state source"
        pairs[m.source][m.xfer] = [plan.epoch, 0]
    out: dict[int | str, Recover | Join] = {
        rank: Recover(
            epoch=plan.epoch,
            groups={n: plan.epoch for n in plan.groups if rank in layout.groups[n].members},
            pairs=pairs[rank],
            hold=hold and bool(plan.moves) and not pairs[rank],
        )
        for rank in alive
    }
    for m in plan.moves:
        out[m.joiner] = join_message(layout, plan, m, activate=True)
    return out


def join_message(layout: Layout, plan: AnyPlan, m: Move, activate: bool) -> Join:
    groups = {g.name: plan.epoch for g in layout.groups_of(m.rank) if len(g.members) > 1}
    return Join(epoch=plan.epoch, rank=m.rank, groups=groups, xfer=m.xfer, activate=activate)
