"""Abort points: an armed stop ends a step's forward or backward between layers, disarmed hooks change
nothing, and a compiled stage keeps its graphs (its layers' hooks are traced as no-ops)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from tmslurm.agent.build import build_runner
from tmslurm.comm.stage_comm import SoloStageComm
from tmslurm.core.config import compose_config
from tmslurm.core.errors import CommAborted
from tmslurm.train.abortpoints import AbortPoints, layers_of


def _cfg(compile_: bool = False):
    return compose_config(
        [
            "parallel.dp=1",
            "parallel.pp=1",
            "model=tiny",
            "model.n_layer=4",
            f"model.compile={str(compile_).lower()}",
            "train.micro_batches=2",
        ]
    )


class Counting(nn.Module):
    def __init__(self, seen: list[str], name: str) -> None:
        super().__init__()
        self.seen, self.name = seen, name
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.name)
        return self.lin(x)


class StopAfter:
    """Raises CommAborted from its ``after``-th call on."""

    def __init__(self, after: int) -> None:
        self.after, self.calls = after, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls > self.after:
            raise CommAborted("test abort")


@pytest.mark.parametrize(
    "module,names",
    [
        (nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.ReLU(), nn.Tanh()])), ["ReLU", "Tanh"]),
        (nn.Sequential(nn.Linear(2, 2), nn.ReLU()), ["Linear", "ReLU"]),
        (nn.Linear(2, 2), []),
    ],
)
def test_layers_are_the_children_of_module_lists_or_else_the_children(module, names):
    assert [type(m).__name__ for m in layers_of(module)] == names


def test_an_armed_stop_ends_the_forward_before_the_next_layer():
    seen: list[str] = []
    model = nn.Sequential(nn.ModuleList([Counting(seen, f"l{i}") for i in range(4)]))
    points = AbortPoints(model)
    x = torch.ones(1, 4)
    stop = StopAfter(2)
    with pytest.raises(CommAborted), points.armed(stop):
        for layer in model[0]:
            x = layer(x)
    assert seen == ["l0", "l1"]
    with points.armed(None):  # disarmed: every layer runs
        for layer in model[0]:
            x = layer(x)
    assert seen[2:] == ["l0", "l1", "l2", "l3"]


def test_an_abort_during_the_backward_stops_it_before_the_earlier_layers():
    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
    points = AbortPoints(layers)
    aborting = []

    def stop() -> None:
        if aborting:
            raise CommAborted("test abort")

    with points.armed(stop):
        y = torch.ones(1, 4)
        for layer in layers:
            y = layer(y)
        aborting.append(True)  # the controller says abort after the forward
        with pytest.raises(CommAborted):
            y.sum().backward()
    assert all(p.grad is None for p in layers[0].parameters()), "the backward reached the first layer"


def test_a_runner_stopped_mid_step_redoes_the_step_bit_identically():
    cfg = _cfg()
    clean, stopped = build_runner(cfg, 0), build_runner(cfg, 0)
    comm = SoloStageComm()
    for step in range(2):
        clean.compute(step, comm)
        clean.apply()
    stopped.compute(0, comm)
    stopped.apply()
    stop = StopAfter(len(stopped.points.layers) + 2)  # the forward of micro-batch 0, then into the next
    with pytest.raises(CommAborted):
        stopped.compute(1, comm, stop=stop)
    stopped.drop()
    stopped.compute(1, comm, stop=lambda: None)
    stopped.apply()
    assert stopped.state_digest() == clean.state_digest()


def test_a_compiled_stage_keeps_its_graphs_and_stops_only_outside_them():
    torch._dynamo.reset()
    counters.clear()
    armed, plain = build_runner(_cfg(compile_=True), 0), build_runner(_cfg(compile_=True), 0)
    comm = SoloStageComm()
    calls = StopAfter(10**9)
    for step in range(3):
        assert armed.compute(step, comm, stop=calls) == plain.compute(step, comm)
        armed.apply()
        plain.apply()
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1 and calls.calls == 0, "a layer inside the compiled region ran its abort point"
    armed.compute(3, comm, stop=calls)
    assert counters["stats"]["unique_graphs"] == graphs, "arming the abort points recompiled a graph"
    assert armed.state_digest() == plain.state_digest()
