"""Layout of a DP x PP x TP run: rank coordinates, roles, shape classes, and the named groups each rank needs.

Contract: ranks are *logical* slots ``0..world-1`` ordered ``rank = (dp * pp + stage) * tp + tp_rank``,
so every rank is named by its (dp, pp, tp) coordinates. A slot keeps its number when the process
serving it is replaced, so group membership is stated in slots and never changes; only the
generation of a group changes when a member is replaced.

Group names are stable and readable: ``dp/stage{j}`` (ranks holding stage j across replicas),
``pp/replica{i}/{j}-{j+1}`` (neighbouring stages of replica i) and, with ``tp > 1``,
``tp/replica{i}/stage{j}`` (the tensor-parallel group of stage j of replica i); the dp and pp names
then get a ``/tp{t}`` suffix (only ranks of the same TP position exchange activations or reduce
gradients). A *shard* is what one rank holds of the model: (stage, tp position); replicas of a shard
are the DP peers with the same (pp, tp) coordinates.

A *shape class* groups the stages whose runner (module, optimizer, compiled graphs) has the same
shapes: the same role and the same number of blocks (``n_layer`` split with :func:`split_layers`).
A universal standby warms one runner per class. Without ``n_layer`` every role is one class.
Invalid coordinates raise :class:`~tmslurm.core.errors.ConfigError` naming the override.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tmslurm.core.errors import ConfigError

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
class ShapeClass:
    """Stages whose runners have identical shapes: one warm runner serves every stage of the class."""

    name: str
    """``only``/``first``/``last``, ``middle``, or ``middle-<n>b`` when middle stages differ in size."""
    role: str
    blocks: int
    """Blocks per stage of this class (0 when the layout was built without ``n_layer``)."""
    stages: tuple[int, ...]

    @property
    def representative(self) -> int:
        """The stage a standby warms up for this class (and whose dp=0, tp=0 rank records it)."""
        return self.stages[0]


@dataclass(frozen=True)
class Layout:
    dp: int
    pp: int
    tp: int = 1
    n_layer: int | None = None
    """Blocks of the model; gives the shape classes (None: one class per role)."""
    zero: int = 0
    """``parallel.zero``: 1 means each rank's optimizer slice has a buddy (:meth:`buddy`)."""

    @classmethod
    def from_config(cls, cfg: Any) -> Layout:
        """The layout of a RunConfig (``parallel.*`` and ``model.n_layer``)."""
        return cls(cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, n_layer=cfg.model.n_layer, zero=cfg.parallel.zero)

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name}={getattr(self, name)} must be >= 1. Fix: pass parallel.{name}=<n>.")
        if self.n_layer is not None:
            split_layers(self.n_layer, self.pp)

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world:
            raise ConfigError(
                f"rank {rank} is outside the layout dp={self.dp} pp={self.pp} tp={self.tp} "
                f"(valid: 0..{self.world - 1})."
            )
        tp_rank = rank % self.tp
        rest = rank // self.tp
        return Coord(dp=rest // self.pp, stage=rest % self.pp, tp=tp_rank)

    def rank(self, dp: int, stage: int, tp: int = 0) -> int:
        if not (0 <= dp < self.dp and 0 <= stage < self.pp and 0 <= tp < self.tp):
            raise ConfigError(f"coordinate dp={dp} stage={stage} tp={tp} is outside the layout {self}.")
        return (dp * self.pp + stage) * self.tp + tp

    def buddy(self, rank: int) -> int:
        """The rank that holds an exact copy of ``rank``'s optimizer slice at ``parallel.zero=1``: its
        data-parallel partner (dp rank XOR 1, same stage and TP position). Buddies are mutual pairs, so
        one rank is the only state source a replacement needs."""
        c = self.coord(rank)
        if self.dp % 2:
            raise ConfigError(
                f"buddies pair data-parallel ranks: parallel.dp={self.dp} must be even. Fix: pass an even parallel.dp."
            )
        return self.rank(c.dp ^ 1, c.stage, c.tp)

    def role_of_stage(self, stage: int) -> str:
        if self.pp == 1:
            return "only"
        if stage == 0:
            return "first"
        return "last" if stage == self.pp - 1 else "middle"

    def role(self, rank: int) -> str:
        return self.role_of_stage(self.coord(rank).stage)

    def stage_blocks(self, stage: int) -> int:
        return 0 if self.n_layer is None else len(split_layers(self.n_layer, self.pp)[stage])

    @cached_property
    def shape_classes(self) -> tuple[ShapeClass, ...]:
        """The distinct shape classes, in pipeline order of their first stage."""
        by_key: dict[tuple[str, int], list[int]] = {}
        for stage in range(self.pp):
            by_key.setdefault((self.role_of_stage(stage), self.stage_blocks(stage)), []).append(stage)
        sizes: dict[str, int] = {}
        for role, _ in by_key:
            sizes[role] = sizes.get(role, 0) + 1
        return tuple(
            ShapeClass(role if sizes[role] == 1 else f"{role}-{blocks}b", role, blocks, tuple(stages))
            for (role, blocks), stages in by_key.items()
        )

    def class_of_stage(self, stage: int) -> ShapeClass:
        return next(c for c in self.shape_classes if stage in c.stages)

    def shape_class(self, rank: int) -> ShapeClass:
        return self.class_of_stage(self.coord(rank).stage)

    @cached_property
    def roles(self) -> tuple[str, ...]:
        """Names of the shape classes in pipeline order: what a universal standby warms up, one runner each."""
        return tuple(c.name for c in self.shape_classes)

    def class_named(self, name: str) -> ShapeClass:
        for c in self.shape_classes:
            if c.name == name:
                return c
        raise ConfigError(f"role {name!r} does not exist in {self}; valid roles: {', '.join(self.roles)}.")

    def representative_stage(self, name: str) -> int:
        """The stage a standby warms up for shape class ``name`` (its first stage)."""
        return self.class_named(name).representative

    def stages_of_class(self, name: str) -> tuple[int, ...]:
        return self.class_named(name).stages

    # ---- shards: what one rank holds ----------------------------------------------------------
    @property
    def shards(self) -> int:
        return self.pp * self.tp

    def shard(self, rank: int) -> int:
        """Index of the (stage, tp) shard ``rank`` holds: ``stage * tp + tp_rank`` (= stage when tp = 1)."""
        c = self.coord(rank)
        return c.stage * self.tp + c.tp

    def shard_name(self, rank: int) -> str:
        """``stage{j}`` (tp = 1) or ``stage{j}-tp{t}``: file and directory name of a shard."""
        c = self.coord(rank)
        return f"stage{c.stage}" + (f"-tp{c.tp}" if self.tp > 1 else "")

    @cached_property
    def shard_names(self) -> list[str]:
        return [self.shard_name(self.rank(0, j, t)) for j in range(self.pp) for t in range(self.tp)]

    @cached_property
    def groups(self) -> dict[str, GroupSpec]:
        """Every named group of the layout, keyed by name."""
        out: dict[str, GroupSpec] = {}
        for stage in range(self.pp):
            for t in range(self.tp):
                name = self._dp_name(stage, t)
                out[name] = GroupSpec(name, tuple(self.rank(d, stage, t) for d in range(self.dp)))
        for d in range(self.dp):
            for stage in range(self.pp - 1):
                for t in range(self.tp):
                    name = self._pair_name(d, stage, t)
                    out[name] = GroupSpec(name, (self.rank(d, stage, t), self.rank(d, stage + 1, t)))
        if self.tp > 1:
            for d in range(self.dp):
                for stage in range(self.pp):
                    name = self._tp_name(d, stage)
                    out[name] = GroupSpec(name, tuple(self.rank(d, stage, t) for t in range(self.tp)))
        return out

    def groups_of(self, rank: int) -> list[GroupSpec]:
        """Named groups that ``rank`` is a member of (dp group first, then its pipeline pairs, then tp)."""
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
        return self._dp_name(c.stage, c.tp)

    def tp_group(self, rank: int) -> str | None:
        """The tensor-parallel group of ``rank`` (None when tp = 1)."""
        c = self.coord(rank)
        return self._tp_name(c.dp, c.stage) if self.tp > 1 else None

    # the one place each group name is spelled (``groups`` and the per-rank look-ups above use them)
    def _dp_name(self, stage: int, tp: int) -> str:
        return f"dp/stage{stage}" + (f"/tp{tp}" if self.tp > 1 else "")

    def _pair_name(self, dp: int, stage: int, tp: int) -> str:
        return f"pp/replica{dp}/{stage}-{stage + 1}" + (f"/tp{tp}" if self.tp > 1 else "")

    def _tp_name(self, dp: int, stage: int) -> str:
        return f"tp/replica{dp}/stage{stage}"


def split_layers(n_layer: int, pp: int) -> list[range]:
    """Balanced contiguous block ranges per stage (earlier stages get the extra block)."""
    if pp > n_layer:
        raise ConfigError(
            f"parallel.pp={pp} is greater than model.n_layer={n_layer}. Fix: pass parallel.pp<={n_layer}."
        )
    base, extra = divmod(n_layer, pp)
    out, start = [], 0
    for stage in range(pp):
        size = base + (1 if stage < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out
