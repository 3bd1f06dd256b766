"""The standby arena: warm runners of every shape class share one buffer, survive re-binding with
their compiled graphs, and a runner loaded from an arena trains bit-identically to its source."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch._dynamo.utils import counters

from tmslurm.agent.build import build_runner, layout_of
from tmslurm.core.config import compose_config
from tmslurm.train.arena import Arena, _layout_bytes, _slots, release_free_memory


def _cfg(compile_: bool):
    return compose_config(
        [
            "parallel.dp=1",
            "parallel.pp=4",
            "model=tiny",
            "model.n_layer=6",
            f"model.compile={str(compile_).lower()}",
            "train.micro_batches=2",
        ]
    )


def _step(runner, step: int) -> None:
    """One local step of a first-stage runner (forward, a scalar loss, backward, optimizer)."""
    x = runner.task.batch(step, 0)[0]
    runner.module(x).float().pow(2).mean().backward()
    runner.apply()


def _inside(t: torch.Tensor, arena: Arena) -> bool:
    start = arena.buffer.data_ptr()
    return start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= start + arena.nbytes


def _received(mine, theirs):
    """``theirs`` copied into ``mine``'s tensors: what recv_state(into=...) gives a joining standby."""
    if isinstance(theirs, torch.Tensor):
        if theirs.dim() == 0:
            return theirs.clone()
        mine.copy_(theirs)
        return mine
    if isinstance(theirs, dict):
        return {k: _received(mine[k], v) for k, v in theirs.items()}
    if isinstance(theirs, list):
        return [_received(a, b) for a, b in zip(mine, theirs)]
    return theirs


def _warm(cfg, stage: int):
    runner = build_runner(cfg, 0, stage=stage)
    if runner.spec.is_first:
        _step(runner, 0)
    return runner


def test_every_class_lives_in_one_buffer_sized_to_the_largest():
    cfg = _cfg(False)
    layout = layout_of(cfg)
    stages = [layout.representative_stage(c.name) for c in layout.shape_classes]
    runners = [build_runner(cfg, 0, stage=s) for s in stages]
    for r in runners:  # moments exist once the optimizer stepped
        for p in r.params:
            p.grad = torch.zeros_like(p)
        r.apply()
    arena = Arena()
    sizes = [arena.bind(r) for r in runners]
    assert len(set(sizes)) > 1, "the classes should differ in size for this test to mean anything"
    assert arena.nbytes == max(sizes)
    for r in runners:
        tensors = [t for _, t in _slots(r)]
        assert tensors and all(_inside(t, arena) for t in tensors)
        assert _layout_bytes(iter(tensors)) <= arena.nbytes


@pytest.mark.parametrize("compile_", [False, True])
def test_rebound_runner_keeps_its_graphs_and_trains_exactly(compile_):
    torch._dynamo.reset()
    counters.clear()
    cfg = _cfg(compile_)
    layout = layout_of(cfg)
    last = layout.representative_stage(layout.shape_classes[-1].name)
    source = _warm(cfg, 0)
    other = build_runner(cfg, 0, stage=last)  # another class, bound first: the buffer grows when 'warm' binds
    for p in other.params:
        p.grad = torch.zeros_like(p)
    other.apply()
    arena = Arena()
    arena.bind(other)
    arena.release()  # as a standby does while the next class warms up
    warm = _warm(cfg, 0)
    arena.bind(warm)
    graphs = counters["stats"]["unique_graphs"]
    for step in range(1, 3):
        _step(source, step)
    warm.load_state(_received(warm.state(), source.state()))  # what a join does; the moments stay arena views
    assert all(_inside(t, arena) for _, t in _slots(warm))
    for step in range(3, 6):
        _step(source, step)
        _step(warm, step)
    assert warm.state_digest() == source.state_digest()
    assert counters["stats"]["unique_graphs"] == graphs, "re-binding the arena recompiled a graph"
    if compile_:
        assert graphs >= 1


def test_a_runner_without_parameters_is_refused():
    class Empty:
        def host_slots(self):
            return iter(())

    with pytest.raises(ValueError, match="no host parameters"):
        Arena().bind(Empty())


def test_release_frees_the_memory_and_bind_gives_it_back_without_keeping_the_runners_own_tensors():
    cfg = _cfg(False)
    layout = layout_of(cfg)
    first, last = (build_runner(cfg, 0, stage=layout.representative_stage(c.name)) for c in layout.shape_classes[:2])
    for r in (first, last):
        for p in r.params:
            p.grad = torch.ones_like(p)
        r.apply()
    arena = Arena()
    arena.bind(first)
    size = arena.nbytes
    arena.release()
    assert arena.released and arena.buffer.untyped_storage().nbytes() == 0 and arena.nbytes == size
    shapes = [tuple(t.shape) for _, t in _slots(first)]
    assert shapes == [tuple(t.shape) for _, t in _slots(first)]  # views keep their metadata while released
    values = [t.clone() for _, t in _slots(last)]
    own = [weakref.ref(v) for st in last.optimizer.state.values() for v in st.values() if v.dim() > 0]
    arena.bind(last)
    assert not arena.released
    assert all(ref() is None for ref in own), "bind kept the runner's own moment tensors alive"
    assert all(torch.equal(a, t) for a, (_, t) in zip(values, _slots(last)))
    assert all(_inside(t, arena) for r in (first, last) for _, t in _slots(r))


def test_a_joined_standby_can_reset_its_peak_rss():
    from tmslurm.agent.build import peak_rss_mb, reset_peak_rss

    big = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
    del big
    release_free_memory()
    before = peak_rss_mb()
    assert reset_peak_rss()
    after = peak_rss_mb()
    assert after <= before - 32, (before, after)


def test_a_sharded_runner_lives_in_the_arena_and_its_views_follow():
    """parallel.zero=1: the flat parameter buffer is one slot; the stage's parameters, the own slice
    and the ward are re-derived as views of it, so loading a state writes into the arena."""
    cfg = compose_config(["parallel.dp=2", "parallel.pp=2", "parallel.zero=1", "model=tiny", "train.micro_batches=2"])
    layout = layout_of(cfg)
    runners = [build_runner(cfg, 0, stage=layout.representative_stage(c.name)) for c in layout.shape_classes]
    for r in runners:  # moments exist once both optimizers stepped
        r.own.grad, r.ward.grad = torch.zeros_like(r.own), torch.zeros_like(r.ward)
        r.apply()
    arena = Arena()
    for r in runners:
        arena.bind(r)
    size = runners[0].flat.element_size()
    for r in runners:
        assert _inside(r.flat, arena) and all(_inside(p, arena) for p in r.params)
        assert all(_inside(t, arena) for _, t in _slots(r)) and len(list(_slots(r))) == 5  # flat + 2 x 2 moments
        assert r.own.data_ptr() == r.flat.data_ptr() + r.dp_rank * r.chunk * size
        assert r.ward.data_ptr() == r.flat.data_ptr() + r.buddy_dp * r.chunk * size
    last = runners[-1]
    last.retarget(last.spec, 1)
    assert last.own.data_ptr() == last.flat.data_ptr() + last.chunk * size
    source = build_runner(cfg, 1 if layout.pp == 2 else 0)  # rank 1: stage 1, dp 0, as a rank builds it
    source.own.grad, source.ward.grad = torch.full_like(source.own, 1e-3), torch.full_like(source.ward, 2e-3)
    source.apply()
    last.load_state(_received(last.state(), source.state_for(1)))
    assert last.state_digest() == source.ward_digest()
    assert _inside(last.own, arena) and all(_inside(t, arena) for _, t in _slots(last))


def test_binding_holds_the_arena_plus_a_few_tensors_not_the_class_twice():
    """Tensors under glibc's mmap threshold live on the heap, where a freed chunk stays in RSS until
    trimmed: bind trims as it goes, so its peak is the arena plus about TRIM_BYTES, not twice the class."""
    from tmslurm.agent.build import peak_rss_mb, reset_peak_rss, rss_mb
    from tmslurm.train.arena import TRIM_BYTES

    raise_threshold = torch.ones(16 * 2**20, dtype=torch.uint8)  # freed, this mmap chunk lifts the threshold to 16 MiB
    del raise_threshold

    class Runner:
        def __init__(self) -> None:
            self.params = [torch.nn.Parameter(torch.ones(2**20)) for _ in range(96)]  # 96 x 4 MiB, on the heap

        def host_slots(self):
            return ((p, p.data) for p in self.params)

    runner = Runner()
    size_mb = 96 * 4
    release_free_memory()
    if not reset_peak_rss():
        pytest.skip("this kernel cannot reset the peak RSS (/proc/self/clear_refs)")
    before = rss_mb()
    arena = Arena()
    arena.bind(runner)
    grew = peak_rss_mb() - before
    assert all(_inside(p, arena) and torch.equal(p, torch.ones_like(p)) for p in runner.params)
    assert grew < 0.5 * size_mb, (
        f"bind's peak grew {grew:.0f} MiB for a {size_mb} MiB class (trim every {TRIM_BYTES >> 20} MiB)"
    )
