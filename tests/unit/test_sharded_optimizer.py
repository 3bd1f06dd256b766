"""The sharded optimizer (parallel.zero=1) without processes: buddy assignment, the recovery plan's
state source, the final hash over slices, the runner's slices, and checkpoints resharded to another dp.

The collectives are simulated in one process by :class:`LocalGroup` (an exact SUM reduce-scatter and
an all-gather over the runners of one stage), so the slice arithmetic is checked here and the real
gloo path end to end in tests/distributed/test_sharded_recovery.py.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from tmslurm.controller.final_hashes import final_hashes, fold_slices
from tmslurm.controller.switch_planning import PlanError, dp_source
from tmslurm.core.config import MODEL_PRESETS, ParallelConfig, RunConfig, TrainConfig, validate
from tmslurm.core.errors import CheckpointError, ConfigError
from tmslurm.core.topology import Layout
from tmslurm.train import checkpoint
from tmslurm.train.ckpt_index import latest_complete
from tmslurm.train.model import ReferenceTask
from tmslurm.train.schedule import StageRunner, state_digest
from tmslurm.train.task import StageSpec
from tmslurm.train.zero import ZeroStageRunner


# ---- buddies and the plan's source ---------------------------------------------------------------
@pytest.mark.parametrize("dp,pp,tp", [(2, 1, 1), (4, 1, 1), (2, 2, 1), (4, 2, 1), (6, 1, 2), (8, 3, 1)])
def test_buddies_are_mutual_pairs_in_the_same_dp_group(dp, pp, tp):
    layout = Layout(dp, pp, tp, zero=1)
    for rank in range(layout.world):
        b = layout.buddy(rank)
        c, cb = layout.coord(rank), layout.coord(b)
        assert b != rank and layout.buddy(b) == rank
        assert (cb.stage, cb.tp) == (c.stage, c.tp) and cb.dp == c.dp ^ 1
        assert layout.dp_group(b) == layout.dp_group(rank)


def test_an_odd_dp_has_no_buddies():
    with pytest.raises(ConfigError, match="parallel.dp"):
        Layout(3, 1, zero=1).buddy(0)


def _recoverable(layout: Layout, dead: set[int]) -> bool:
    return all(layout.buddy(r) not in dead for r in dead)


@pytest.mark.parametrize("dp,pp", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_source_is_the_buddy_for_every_failure_set_of_up_to_three_ranks(dp, pp):
    layout = Layout(dp, pp, zero=1)
    for k in (1, 2, 3):
        for dead in map(set, itertools.combinations(range(layout.world), k)):
            if _recoverable(layout, dead):
                for rank in dead:
                    assert dp_source(layout, rank, dead) == layout.buddy(rank)
            else:
                lost = next(r for r in sorted(dead) if layout.buddy(r) in dead)
                with pytest.raises(PlanError, match="exists nowhere else"):
                    dp_source(layout, lost, dead)


@pytest.mark.parametrize(
    "dead,sources",
    [
        ({0}, {0: 1}),
        ({3}, {3: 2}),
        ({0, 2}, {0: 1, 2: 3}),  # two failures in different pairs: each from its buddy
        ({0, 3}, {0: 1, 3: 2}),
        ({0, 1}, {0: None, 1: None}),  # a slice and its buddy together: checkpoint fallback
        ({1, 2, 3}, {1: 0, 2: None, 3: None}),
    ],
)
def test_dp4_pp1_sources(dead, sources):
    layout = Layout(4, 1, zero=1)  # pp=1: rank = dp rank; pairs (0, 1) and (2, 3)
    for rank, source in sources.items():
        if source is None:
            with pytest.raises(PlanError, match="both lost"):
                dp_source(layout, rank, dead)
        else:
            assert dp_source(layout, rank, dead) == source


def test_zero0_source_is_any_alive_peer_not_the_buddy_rule():
    assert dp_source(Layout(4, 1), 0, {0, 1}) == 2


@pytest.mark.parametrize("dp,ok", [(1, False), (2, True), (3, False), (4, True)])
def test_config_needs_an_even_dp(dp, ok):
    cfg = RunConfig(parallel=ParallelConfig(dp=dp, pp=1, zero=1))
    if ok:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match="parallel.zero=1"):
            validate(cfg)


def test_config_refuses_other_zero_levels():
    with pytest.raises(ConfigError, match="parallel.zero=2"):
        validate(RunConfig(parallel=ParallelConfig(dp=2, pp=1, zero=2)))


# ---- the final hash over slices ------------------------------------------------------------------
def _reports(ward_of_1: str = "s0"):
    # one shard, dp=2: rank 0 holds slice 0 (digest s0) and rank 1's copy, rank 1 the other way round
    return {0: (0, "P", "s0", 0, "s1"), 1: (0, "P", "s1", 1, ward_of_1)}


def test_fold_slices_gives_one_state_per_shard():
    folded = fold_slices(_reports(), Layout(2, 1, zero=1).buddy)
    h = final_hashes(folded, 1)
    assert h["replicas_equal"] and h["final_state_sha256"] is not None
    other = final_hashes(
        fold_slices({0: (0, "P", "s0", 0, "sX"), 1: (0, "P", "sX", 1, "s0")}, Layout(2, 1, zero=1).buddy), 1
    )
    assert other["final_state_sha256"] not in (None, h["final_state_sha256"])  # another slice 1: another hash
    swapped = final_hashes(
        fold_slices({0: (0, "P", "s1", 0, "s0"), 1: (0, "P", "s0", 1, "s1")}, Layout(2, 1, zero=1).buddy), 1
    )
    assert swapped["final_state_sha256"] != h["final_state_sha256"]  # slice order counts


def test_a_buddy_copy_that_differs_gives_no_final_hash():
    h = final_hashes(fold_slices(_reports(ward_of_1="bad"), Layout(2, 1, zero=1).buddy), 1)
    assert h["final_state_sha256"] is None and h["diverging"]


# ---- the runner's slices, with the collectives simulated -----------------------------------------
class LocalGroup:
    """Exact in-process collectives for the runners of one stage; runners call in dp order."""

    def __init__(self, runners: list[ZeroStageRunner]) -> None:
        self.runners = runners

    def gather(self) -> None:
        full = torch.cat([r.own.detach().clone() for r in self.runners])  # own steps are synchronous
        for r in self.runners:
            r.gather(_Gathered(full, r.chunk))
            assert torch.equal(r.flat, full)  # the ward wrote its buddy's slice bit for bit

    def step(self, grads: list[torch.Tensor]) -> None:
        """Give every runner the reduced gradient slices (own and ward) of the sum of ``grads``."""
        total = torch.stack(grads).sum(0)
        for r in self.runners:
            r.own.grad = total[r.dp_rank * r.chunk : (r.dp_rank + 1) * r.chunk].clone()
            r.ward.grad = total[r.buddy_dp * r.chunk : (r.buddy_dp + 1) * r.chunk].clone()
            r.apply()


class _Gathered:
    """A StageComm's all-gather that hands out ``full``, leaving the ``skip`` chunk as the runner has
    it (its ward writes that region), as the fabric does."""

    def __init__(self, full: torch.Tensor, chunk: int) -> None:
        self.full = full
        self.chunk = chunk

    def all_gather(self, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        with torch.no_grad():
            for i, part in enumerate(self.full.split(self.chunk)):
                if i != skip:
                    flat[i * self.chunk : (i + 1) * self.chunk].copy_(part)
        return flat


def _zero_runners(dp: int) -> list[ZeroStageRunner]:
    task = ReferenceTask(MODEL_PRESETS["tiny"], TrainConfig())
    return [ZeroStageRunner(task, StageSpec(0, 1, "only", range(4)), d, dp, 1, torch.device("cpu")) for d in range(dp)]


def _train(runners: list[ZeroStageRunner], steps: int, seed: int = 0) -> None:
    group = LocalGroup(runners)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        group.gather()
        size = runners[0].flat.numel()
        grads = [torch.randn(size, generator=g) * 1e-2 for _ in runners]
        for grad in grads:
            grad[runners[0].numel :] = 0  # padding has no gradient
        group.step(grads)
    group.gather()


@pytest.mark.parametrize("dp", [2, 4])
def test_slices_cover_the_parameters_and_the_ward_equals_the_buddy(dp):
    runners = _zero_runners(dp)
    assert runners[0].chunk * dp >= runners[0].numel > runners[0].chunk * (dp - 1)
    _train(runners, 3)
    for r in runners:
        assert r.ward_digest() == runners[r.buddy_dp].state_digest()
        assert r.digest() == runners[0].digest()  # after the gather every rank holds all parameters
        assert state_digest(r.state_for(r.buddy_dp)["own"]) == runners[r.buddy_dp].state_digest()
    with pytest.raises(ValueError):
        runners[0].state_for(3 if dp == 4 else 5)


def test_a_replacement_loaded_from_its_buddy_continues_exactly():
    ref, hurt = _zero_runners(4), _zero_runners(4)
    _train(ref, 2, seed=1)
    _train(hurt, 2, seed=1)
    fresh = _zero_runners(4)[2]  # rank 2 dies; its buddy (3) sends what rank 2 needs
    fresh.load_state(copy.deepcopy(hurt[3].state_for(2)))  # a copy, as a transfer delivers it
    hurt[2] = fresh
    assert fresh.state_digest() == ref[2].state_digest()
    LocalGroup(hurt).gather()  # the buddy's parameter slice comes with the next all-gather, as in a run
    assert fresh.ward_digest() == ref[2].ward_digest()
    _train(ref, 2, seed=2)
    _train(hurt, 2, seed=2)
    assert [r.state_digest() for r in hurt] == [r.state_digest() for r in ref]
    assert [r.ward_digest() for r in hurt] == [r.ward_digest() for r in ref]


def test_optimizer_bytes_at_dp4_are_half_of_a_whole_optimizer():
    task = ReferenceTask(MODEL_PRESETS["tiny"], TrainConfig())
    whole = StageRunner(task, StageSpec(0, 1, "only", range(4)), 0, 4, 1, torch.device("cpu"))
    for p in whole.params:
        p.grad = torch.zeros_like(p)
    whole.apply()
    runners = _zero_runners(4)
    _train(runners, 1)
    ratio = runners[0].optimizer_bytes() / whole.optimizer_bytes()
    assert 0.49 < ratio <= 0.55, ratio


def test_a_task_with_two_parameter_groups_is_refused():
    class TwoGroups(ReferenceTask):
        def build_optimizer(self, module):
            ps = list(module.parameters())
            return torch.optim.AdamW([{"params": ps[:1]}, {"params": ps[1:], "weight_decay": 0.0}])

    with pytest.raises(ConfigError, match="parallel.zero"):
        ZeroStageRunner(
            TwoGroups(MODEL_PRESETS["tiny"], TrainConfig()),
            StageSpec(0, 1, "only", range(4)),
            0,
            2,
            1,
            torch.device("cpu"),
        )


# ---- checkpoints of slices -----------------------------------------------------------------------
def _save(tmp_path, runners: list[ZeroStageRunner], step: int) -> None:
    layout = Layout(runners[0].dp, 1, zero=1)
    for r in runners:
        checkpoint.save_stage(tmp_path, step, checkpoint.shard_of(layout, layout.rank(r.dp_rank, 0)), r)


@pytest.mark.parametrize("saved_dp,new_dp", [(2, 2), (2, 4), (4, 2)])
def test_a_checkpoint_of_slices_loads_at_the_same_or_another_dp(tmp_path, saved_dp, new_dp):
    src = _zero_runners(saved_dp)
    _train(src, 2)
    _save(tmp_path, src, 2)
    assert latest_complete(tmp_path, ["stage0"]) == 2
    full = src[0].flat[: src[0].numel].clone()
    exp_avg = torch.cat([r.optimizer.state[r.own]["exp_avg"] for r in src])[: src[0].numel]
    dst = _zero_runners(new_dp)
    for r in dst:
        checkpoint.load_stage(tmp_path, 2, "stage0", r)
    LocalGroup(dst).gather()
    assert torch.equal(dst[0].flat[: dst[0].numel], full)
    assert torch.equal(torch.cat([r.optimizer.state[r.own]["exp_avg"] for r in dst])[: dst[0].numel], exp_avg)
    for r in dst:
        assert r.ward_digest() == dst[r.buddy_dp].state_digest()
        assert int(r.optimizer.state[r.own]["step"]) == 2


def test_an_incomplete_set_of_slices_is_not_a_checkpoint(tmp_path):
    src = _zero_runners(2)
    _train(src, 1)
    _save(tmp_path, src[:1], 1)
    assert latest_complete(tmp_path, ["stage0"]) is None
    with pytest.raises(CheckpointError, match="incomplete"):
        checkpoint.load_stage(tmp_path, 1, "stage0", _zero_runners(2)[0])


def test_zero_levels_do_not_load_each_others_checkpoints(tmp_path):
    task = ReferenceTask(MODEL_PRESETS["tiny"], TrainConfig())
    whole = StageRunner(task, StageSpec(0, 1, "only", range(4)), 0, 2, 1, torch.device("cpu"))
    checkpoint.save_stage(tmp_path / "a", 1, "stage0", whole)
    with pytest.raises(CheckpointError, match="parallel.zero=0"):
        checkpoint.load_stage(tmp_path / "a", 1, "stage0", _zero_runners(2)[0])
    src = _zero_runners(2)
    _train(src, 1)
    _save(tmp_path / "b", src, 1)
    with pytest.raises(CheckpointError, match="parallel.zero=1"):
        checkpoint.load_stage(tmp_path / "b", 1, "stage0", whole)
