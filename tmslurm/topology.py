"""Layout of a DP x PP (x TP) run: rank coordinates, roles, and the named groups each rank needs.

Contract: ranks are *logical* slots ``0..world-1`` ordered ``rank = (dp * pp + stage) * tp + tp_rank``.
A slot keeps its number when the process serving it is replaced, so group membership is stated in
slots and never changes; only the generation of a group changes when a member is replaced.

Group names are stable and readable: ``dp/stage{j}`` (ranks holding stage j across replicas) and
``pp/replica{i}/{j}-{j+1}`` (neighbouring stages of replica i). Invalid coordinates raise
:class:`~tmslurm.errors.ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tmslurm.errors import ConfigError

ROLES = ("only", "first", "middle", "last")


@dataclass(frozen=True)
class Coord:
    dp: int
    stage: int
    tp: int = 0


@dataclass(frozen=True)
class GroupSpec:
    """A named group: its name and its members (logical ranks) in group-rank order."""

    name: str
    members: tuple[int, ...]

    def group_rank(self, rank: int) -> int:
        return self.members.index(rank)


@dataclass(frozen=True)
class Layout:
    dp: int
    pp: int
    tp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name}={getattr(self, name)} must be >= 1. Fix: pass parallel.{name}=<n>.")

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world:
            raise ConfigError(f"rank {rank} is outside the layout dp={self.dp} pp={self.pp} tp={self.tp} (valid: 0..{self.world - 1}).")
        tp_rank = rank % self.tp
        rest = rank // self.tp
        return Coord(dp=rest // self.pp, stage=rest % self.pp, tp=tp_rank)

    def rank(self, dp: int, stage: int, tp: int = 0) -> int:
        if not (0 <= dp < self.dp and 0 <= stage < self.pp and 0 <= tp < self.tp):
            raise ConfigError(f"coordinate dp={dp} stage={stage} tp={tp} is outside the layout {self}.")
        return (dp * self.pp + stage) * self.tp + tp

    def role_of_stage(self, stage: int) -> str:
        if self.pp == 1:
            return "only"
        if stage == 0:
            return "first"
        return "last" if stage == self.pp - 1 else "middle"

    def role(self, rank: int) -> str:
        return self.role_of_stage(self.coord(rank).stage)

    @cached_property
    def roles(self) -> tuple[str, ...]:
        """Distinct roles of this layout, in pipeline order (what a universal standby warms up)."""
        seen: list[str] = []
        for stage in range(self.pp):
            role = self.role_of_stage(stage)
            if role not in seen:
                seen.append(role)
        return tuple(seen)

    def representative_stage(self, role: str) -> int:
        """The stage a standby warms up for ``role`` (the first stage having that role)."""
        for stage in range(self.pp):
            if self.role_of_stage(stage) == role:
                return stage
        raise ConfigError(f"role {role!r} does not exist in {self}; valid roles: {', '.join(self.roles)}.")

    @cached_property
    def groups(self) -> dict[str, GroupSpec]:
        """Every named group of the layout, keyed by name."""
        out: dict[str, GroupSpec] = {}
        for stage in range(self.pp):
            for t in range(self.tp):
                name = f"dp/stage{stage}" + (f"/tp{t}" if self.tp > 1 else "")
                out[name] = GroupSpec(name, tuple(self.rank(d, stage, t) for d in range(self.dp)))
        for d in range(self.dp):
            for stage in range(self.pp - 1):
                for t in range(self.tp):
                    name = f"pp/replica{d}/{stage}-{stage + 1}" + (f"/tp{t}" if self.tp > 1 else "")
                    out[name] = GroupSpec(name, (self.rank(d, stage, t), self.rank(d, stage + 1, t)))
        return out

    def groups_of(self, rank: int) -> list[GroupSpec]:
        """Named groups that ``rank`` is a member of (dp group first, then its pipeline pairs)."""
        return [g for g in self.groups.values() if rank in g.members]

    def affected_groups(self, ranks: set[int] | list[int]) -> list[str]:
        """Names of the groups that contain any of ``ranks`` (the ones a switch must rebuild)."""
        leaving = set(ranks)
        return [name for name, g in self.groups.items() if leaving & set(g.members)]

    def pp_prev(self, rank: int) -> str | None:
        c = self.coord(rank)
        return None if c.stage == 0 else self._pair_name(c.dp, c.stage - 1, c.tp)

    def pp_next(self, rank: int) -> str | None:
        c = self.coord(rank)
        return None if c.stage == self.pp - 1 else self._pair_name(c.dp, c.stage, c.tp)

    def dp_group(self, rank: int) -> str:
        c = self.coord(rank)
        return f"dp/stage{c.stage}" + (f"/tp{c.tp}" if self.tp > 1 else "")

    def _pair_name(self, dp: int, stage: int, tp: int) -> str:
        return f"pp/replica{dp}/{stage}-{stage + 1}" + (f"/tp{tp}" if self.tp > 1 else "")


def split_layers(n_layer: int, pp: int) -> list[range]:
    """Balanced contiguous block ranges per stage (earlier stages get the extra block)."""
    if pp > n_layer:
        raise ConfigError(f"parallel.pp={pp} is greater than model.n_layer={n_layer}. Fix: pass parallel.pp<={n_layer}.")
    base, extra = divmod(n_layer, pp)
    out, start = [], 0
    for stage in range(pp):
        size = base + (1 if stage < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out
