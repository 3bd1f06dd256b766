"""A worker's fault plan (:mod:`tmslurm.agent.faults`): which fault fires at which named point of the
step loop, what it reports and which signal it sends; each fires once. Effects are recorded, never
carried out (no signal, no hang, no pause)."""

from __future__ import annotations

import signal

import pytest

from tmslurm.agent.faults import SETTLE_S, FaultPlan
from tmslurm.wire.messages import FaultFired, FaultSpec

RANK = 2


def spec(index: int, step: int, kind: str, when: str = "midstep", amount: str = "") -> FaultSpec:
    return FaultSpec(index=index, step=step, kind=kind, rank=RANK, ranks=[RANK], amount=amount, when=when)


class Effects:
    def __init__(self) -> None:
        self.log: list[tuple] = []

    def plan(self, specs: list[FaultSpec]) -> FaultPlan:
        return FaultPlan(
            specs,
            RANK,
            lambda m: self.log.append(("sent", m)),
            kill=lambda s: self.log.append(("kill", s)),
            pause=lambda s: self.log.append(("pause", s)),
            hang=lambda: self.log.append(("hang",)),
        )


def fired(index: int, step: int, kind: str) -> tuple:
    return ("sent", FaultFired(index=index, rank=RANK, step=step, kind=kind))


def killed(index: int, step: int, kind: str, signum: int) -> list[tuple]:
    return [fired(index, step, kind), ("pause", SETTLE_S), ("kill", signum)]


def run(plan: FaultPlan, calls: list[tuple[str, int]]) -> None:
    """Call the plan at each (point, step) as the worker does (a midstep action is run mid-step)."""
    for point, step in calls:
        if point == "midstep":
            action = plan.midstep(step)
            if action is not None:
                action()
        else:
            getattr(plan, point)(step)


ALL_POINTS = [(p, s) for s in range(6) for p in ("midstep", "before_vote", "before_recovery")]


@pytest.mark.parametrize(
    "specs,calls,effects",
    [
        pytest.param([], ALL_POINTS, [], id="no faults: nothing anywhere"),
        pytest.param([spec(0, 3, "kill")], ALL_POINTS, killed(0, 3, "kill", signal.SIGKILL), id="kill mid-step 3"),
        pytest.param([spec(1, 2, "stop")], ALL_POINTS, killed(1, 2, "stop", signal.SIGSTOP), id="stop mid-step 2"),
        pytest.param(
            [spec(0, 2, "kill")],
            [("midstep", 1), ("before_vote", 2), ("before_recovery", 2)],
            [],
            id="a mid-step fault fires mid-step only",
        ),
        pytest.param(
            [spec(0, 2, "kill", "recover")],
            [
                ("midstep", 2),
                ("before_vote", 2),
                ("before_recovery", 1),
                ("before_recovery", 4),
                ("before_recovery", 5),
            ],
            killed(0, 4, "kill", signal.SIGKILL),
            id="recover: first recovery at a step >= its step",
        ),
        pytest.param(
            [spec(0, 1, "stop", "recover")],
            [("before_recovery", 1)],
            killed(0, 1, "stop", signal.SIGSTOP),
            id="recover: stop at its very step",
        ),
        pytest.param(
            [spec(4, 3, "hang")], ALL_POINTS, [fired(4, 3, "hang"), ("hang",)], id="hang before the vote of 3"
        ),
        pytest.param(
            [spec(0, 1, "drain"), spec(1, 2, "power_off")],
            ALL_POINTS,
            [],
            id="kinds the controller injects never fire here",
        ),
        pytest.param(
            [spec(0, 2, "stop"), spec(1, 2, "kill")],
            [("midstep", 2), ("midstep", 2), ("midstep", 2)],
            killed(0, 2, "stop", signal.SIGSTOP) + killed(1, 2, "kill", signal.SIGKILL),
            id="two faults of one step: in order, one per step attempt",
        ),
        pytest.param(
            [spec(0, 3, "kill", "transfer")],
            [
                ("during_transfer", 2),
                ("midstep", 3),
                ("before_recovery", 3),
                ("during_transfer", 4),
                ("during_transfer", 5),
            ],
            killed(0, 4, "kill", signal.SIGKILL),
            id="transfer: the first state sent at a step >= its step",
        ),
        pytest.param(
            [spec(0, 1, "stop", "join")],
            [("during_transfer", 5), ("midstep", 1), ("before_recovery", 1)],
            [],
            id="a join fault never fires in a worker's transfer",
        ),
        pytest.param(
            [spec(0, 2, "hiccup", amount="2")],
            ALL_POINTS,
            [fired(0, 2, "hiccup"), ("pause", 2.0)],
            id="hiccup: stalls once mid-step 2, no signal",
        ),
        pytest.param(
            [spec(0, 3, "slow", amount="0.25")],
            ALL_POINTS,
            [fired(0, 3, "slow"), ("pause", 0.25), ("pause", 0.25), ("pause", 0.25)],
            id="slow: reported once, stalls every step from 3 on",
        ),
        pytest.param(
            [spec(0, 1, "slow", amount="0.5"), spec(1, 2, "kill")],
            [("midstep", 1), ("midstep", 2)],
            [fired(0, 1, "slow"), ("pause", 0.5), ("pause", 0.5)] + killed(1, 2, "kill", signal.SIGKILL),
            id="a slow rank still dies of its kill",
        ),
    ],
)
def test_each_fault_fires_once_at_its_point(specs, calls, effects):
    fx = Effects()
    run(fx.plan(specs), calls)
    assert fx.log == effects


def test_a_midstep_action_not_run_leaves_the_fault_pending():
    """A step that failed before its midstep point is redone: the fault fires in the redo."""
    fx = Effects()
    plan = fx.plan([spec(0, 3, "kill")])
    assert plan.midstep(3) is not None and fx.log == []  # the step failed before the action ran
    run(plan, [("midstep", 3)])
    assert fx.log == killed(0, 3, "kill", signal.SIGKILL) and plan.pending == []


def test_a_joiner_fires_its_join_fault_mid_receive():
    fx = Effects()
    plan = fx.plan([spec(3, 7, "kill", "join")])
    plan.during_transfer(None, "join")
    plan.during_transfer(None, "join")
    assert fx.log == killed(3, 7, "kill", signal.SIGKILL)


def test_the_empty_plan_does_nothing():
    plan = FaultPlan.none()
    assert plan.pending == [] and plan.midstep(0) is None
    plan.before_vote(0)
    plan.before_recovery(0)
