"""Live shadowing over a real gloo pair: a standby that starts from a snapshot and then applies the
leaver's reduced gradients (each sent before its step is decided, one of them aborted and dropped)
stays bit-identical over 50 steps, and leaves :func:`follow` at the switch step's commit; the
fingerprints are compared after that (:func:`check`), as they are behind the new rank's first
step; a forced mismatch falls back to a full transfer (:func:`repair`); a switch without a shadow
sends the whole state."""

from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

pytestmark = pytest.mark.dist


class _Runner:
    """The parts of a StageRunner that shadowing uses, over a small model with AdamW."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=1e-2)
        self.params = list(self.module.parameters())
        self.reduced: torch.Tensor | None = None

    def compute(self, step: int) -> None:
        torch.manual_seed(1000 + step)
        self.module(torch.randn(8, 16)).pow(2).mean().backward()
        grads = [p.grad for p in self.params]
        self.reduced = _flatten_dense_tensors(grads)  # what StageRunner._reduce leaves
        for p, g in zip(self.params, _unflatten_dense_tensors(self.reduced, grads)):
            p.grad = g

    def apply(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state(self):
        return {"model": self.module.state_dict(), "optim": self.optimizer.state_dict()}

    def load_state(self, state) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])


def _peer(rank: int, port: int, q, mode: str) -> None:
    from tmslurm.comm.shadow import ShadowSender, check, follow, repair, send_full
    from tmslurm.train.schedule import state_digest

    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("xfer", store), rank, 2, datetime.timedelta(seconds=30))
    if rank == 1:  # the standby: other initial values, so only what it receives can make it equal
        runner = _Runner(seed=1)
        got = follow(
            pg, runner, 30, lambda: False, lambda step, s: q.put(("caught_up", step)), corrupt=(mode == "mismatch")
        )
        matched, received = False, got.switch_bytes
        if got.shadowed:
            matched = check(pg, runner, 30, lambda: False)
            received = 0 if matched else repair(pg, runner, 30, lambda: False)
        q.put(("standby", got.step, got.shadowed, matched, got.steps, received, state_digest(runner.state())))
        return
    runner = _Runner(seed=0)
    sender = ShadowSender(pg, 30) if mode != "full" else None
    for step in range(60):
        runner.compute(step)
        if sender is not None and step > 9:
            sender.grads(step, runner.reduced)  # sent before the step is decided
            if step == 20:  # aborted once: the standby drops it, and the step is redone
                sender.decided(step, committed=False)
                runner.optimizer.zero_grad(set_to_none=True)
                runner.compute(step)
                sender.grads(step, runner.reduced)
            sender.decided(step, committed=True, last=(step == 59))  # the switch rides on step 59
        if sender is not None:
            sender.wait(state_only=True)  # a START reads the parameters this update changes
        runner.apply()
        if sender is not None and step == 9:
            sender.start(step + 1, runner.state())
    if sender is None:
        nbytes, matched = send_full(pg, 60, runner.state(), 30), False
    else:
        matched, nbytes = sender.finish(60, runner.state())
    q.put(("leaver", matched, nbytes, state_digest(runner.state()), sender.steps if sender else 0))


def _run(mode: str):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, store.port, q, mode), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    while not {"leaver", "standby"} <= set(out):
        item = q.get(timeout=120)
        out[item[0]] = item[1:]
    for p in procs:
        p.join(10)
    return out


def test_shadow_stays_exact_over_50_steps():
    out = _run("exact")
    assert out["caught_up"] == (10,)
    matched, sent, digest, followed = out["leaver"]
    step, shadowed, standby_matched, steps, received, standby_digest = out["standby"]
    assert (step, shadowed, matched, standby_matched) == (60, True, True, True)
    assert steps == followed == 50
    assert sent == received == 0  # the switch moved no state
    assert standby_digest == digest


def test_forced_mismatch_falls_back_to_a_full_transfer():
    out = _run("mismatch")
    matched, sent, digest, _ = out["leaver"]
    _, shadowed, standby_matched, _, received, standby_digest = out["standby"]
    assert shadowed and not matched and not standby_matched
    assert sent == received > 0
    assert standby_digest == digest  # the fallback repaired the corrupted shadow


def test_without_a_shadow_the_switch_sends_everything():
    out = _run("full")
    _, sent, digest, _ = out["leaver"]
    _, shadowed, _, steps, received, standby_digest = out["standby"]
    assert not shadowed and steps == 0
    assert sent == received > 0
    assert standby_digest == digest
