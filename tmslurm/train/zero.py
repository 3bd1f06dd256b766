"""Sharded optimizer state (ZeRO-1) with an exact in-memory buddy copy of every slice.

Contract (``parallel.zero=1``): :class:`ZeroStageRunner` is a :class:`~tmslurm.train.schedule.StageRunner`
whose stage parameters are views of one flat buffer (padded to a multiple of dp). Each data-parallel
rank r of a stage owns the slice ``[r*S, (r+1)*S)`` of that buffer, S = ceil(numel / dp): it keeps the
optimizer state (the Task's optimizer built over that one flat slice) of its slice only, and steps
only that slice. Per step:

1. ``compute`` first all-gathers the flat parameters over the stage's DP group (every slice as its
   owner last committed it), then runs the schedule;
2. the flat gradient is reduce-scattered (SUM; the schedule pre-scales the loss), so rank r gets the
   reduced gradient of slice r, and swaps it with its *buddy* (:meth:`Layout.buddy`, dp rank XOR 1);
3. ``apply`` (after the commit decision) steps the own slice with the own optimizer, and starts the
   step of the buddy's slice with a second optimizer, the *ward*, which holds the buddy's moments:
   same code, same inputs, so the ward stays bit-identical to the buddy's own state at every
   committed step. The ward's step runs in a thread while the next all-gather runs; that gather
   skips the ward's region of the flat buffer (the ward writes the same values there), and the
   forward pass, and anything that reads the ward, waits for it.

The buddy's parameter slice needs no copy of its own: after step 1 every rank holds it in its flat
buffer, and the ward's update writes it there. So a rank holds its parameters, 1/dp of the moments
and a buddy's 1/dp: at dp=4 with AdamW, half of the optimizer bytes of ``zero=0``.

State: :meth:`state` is ``{"own": {"param", "optim"}, "ward": {"optim"}}``; :meth:`state_for` gives the
state a replacement of the buddy needs (own and ward swapped), so the only source a replacement ever
needs is its buddy (unexpected failure) or the leaver itself (planned move). Parameters outside the
own slice are not state: the next all-gather rewrites them.

A zero=1 run is deterministic (the gloo collectives of a fixed group size reduce in a fixed order)
but not bit-identical to zero=0: a reduce-scatter sums in another order than an all-reduce, and the
optimizer runs over one flat tensor.

Failure behaviour: a Task whose optimizer has more than one parameter group, or whose parameters
mix dtypes, is refused with a :class:`~tmslurm.core.errors.ConfigError` naming ``parallel.zero``. A
communication failure propagates from the StageComm as in :class:`StageRunner`, and nothing is
applied.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from tmslurm.comm.stage_comm import StageComm
from tmslurm.core.errors import ConfigError
from tmslurm.train.abortpoints import Stop
from tmslurm.train.schedule import StageRunner, optimizer_slots, state_digest, tensor_bytes
from tmslurm.train.task import StageSpec, Task


class _Holder(nn.Module):
    """One flat parameter: what the Task's ``build_optimizer`` is given at zero=1."""

    def __init__(self, flat: nn.Parameter) -> None:
        super().__init__()
        self.flat = flat


class ZeroStageRunner(StageRunner):
    def __init__(
        self, task: Task, spec: StageSpec, dp_rank: int, dp: int, micro_batches: int, device: torch.device
    ) -> None:
        super().__init__(task, spec, dp_rank, dp, micro_batches, device)
        if len(self.optimizer.param_groups) != 1:
            raise ConfigError(
                f"parallel.zero=1 steps one flat slice per rank, but the Task's optimizer has "
                f"{len(self.optimizer.param_groups)} parameter groups. Fix: pass parallel.zero=0, or give "
                f"the Task one parameter group."
            )
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ConfigError(
                f"parallel.zero=1 needs one parameter dtype per stage; got {sorted(map(str, dtypes))}. "
                f"Fix: pass parallel.zero=0."
            )
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = -(-self.numel // dp)
        self.flat = torch.zeros(self.chunk * dp, dtype=dtypes.pop(), device=device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                self.flat[offset : offset + n].copy_(p.data.reshape(-1))
                p.data = self.flat[offset : offset + n].view_as(p)
                offset += n
        self.own = nn.Parameter(self._slice(dp_rank))
        self.ward = nn.Parameter(self._slice(dp_rank ^ 1))
        self.optimizer = task.build_optimizer(_Holder(self.own))
        self.ward_optimizer = task.build_optimizer(_Holder(self.ward))
        self.swap_s = 0.0
        """The last step's buddy swap (seconds)."""
        self._ward_thread: threading.Thread | None = None
        """The ward's optimizer step of the last commit, running while the next all-gather does."""
        self._ward_error: list[BaseException] = []
        self._ward_current = False
        """The flat buffer's ward region holds the buddy's last committed slice, written by the ward's
        step (so the next all-gather may skip that region); False until a full all-gather wrote it."""
        self.buddy_s: list[float] = []
        """Per committed step: what the buddy cost this rank (the swap plus the ward's optimizer step)."""

    def host_slots(self) -> Iterator[tuple[Any, torch.Tensor]]:
        """The flat parameter buffer (re-bound through :meth:`_set_flat`), then the own and the ward moments."""
        self._join_ward()
        if self.flat.device.type == "cpu":
            yield self._set_flat, self.flat
        yield from optimizer_slots(self.optimizer, [self.own])
        yield from optimizer_slots(self.ward_optimizer, [self.ward])

    def _set_flat(self, flat: torch.Tensor) -> None:
        """Move the flat parameter buffer to ``flat`` (same size, values already copied): every stage
        parameter, the own slice and the ward become views of it again."""
        self.flat = flat
        offset = 0
        for p in self.params:
            n = p.numel()
            p.data = flat[offset : offset + n].view_as(p)
            offset += n
        self.own.data = self._slice(self.dp_rank)
        self.ward.data = self._slice(self.buddy_dp)

    def _slice(self, dp_rank: int) -> torch.Tensor:
        return self.flat[dp_rank * self.chunk : (dp_rank + 1) * self.chunk]

    @property
    def buddy_dp(self) -> int:
        return self.dp_rank ^ 1

    # ---- the step -----------------------------------------------------------------------------
    def compute(
        self, step: int, comm: StageComm, midstep: Callable[[], None] | None = None, stop: Stop | None = None
    ) -> float | None:
        self._gather(comm)
        return super().compute(step, comm, midstep, stop)

    def _gather(self, comm: StageComm) -> None:
        """All-gather the parameters. While the ward's step still runs, the buddy's chunk is received
        into scratch (the ward writes the same values there), and the ward is waited for after."""
        skip = self.buddy_dp if self._ward_current else None
        if skip is None:
            self._join_ward()
        try:
            with torch.no_grad():
                comm.all_gather(self.flat, skip)
        finally:
            waited = self._join_ward()
        if self.buddy_s:
            self.buddy_s[-1] += waited
        self._ward_current = True

    def _reduce(self, comm: StageComm) -> None:
        grads = torch.zeros_like(self.flat)
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                grads[offset : offset + n].copy_(p.grad.reshape(-1))
            p.grad = None
            offset += n
        own = comm.reduce_scatter(grads)
        del grads
        self.reduced = own
        self.own.grad = own
        t0 = time.perf_counter()
        self.ward.grad = comm.swap(own)
        self.swap_s = time.perf_counter() - t0

    def gather(self, comm: StageComm) -> None:
        """Make every parameter current (the run's end: final digests and files read all of them)."""
        self._gather(comm)

    def retarget(self, spec: StageSpec, dp_rank: int) -> None:
        self._join_ward()
        super().retarget(spec, dp_rank)
        self.own.data = self._slice(dp_rank)
        self.ward.data = self._slice(dp_rank ^ 1)
        self._ward_current = False

    def apply(self) -> None:
        """Step the own slice now and start the ward's step in a thread: the next all-gather (which
        skips the ward's region) overlaps it, and anything that reads the ward waits for it."""
        self._join_ward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None
        self.reduced = None
        self.buddy_s.append(self.swap_s)
        self._ward_thread = threading.Thread(target=self._ward_step, name="zero-ward", daemon=True)
        self._ward_thread.start()

    def _ward_step(self) -> None:
        try:
            self.ward_optimizer.step()
            self.ward_optimizer.zero_grad(set_to_none=True)
        except BaseException as exc:  # handed to the step loop's thread by _join_ward
            self._ward_error.append(exc)

    def _join_ward(self) -> float:
        """Wait for the ward's step in flight; its seconds waited. Its error, if any, is raised here."""
        thread, self._ward_thread = self._ward_thread, None
        if thread is None:
            return 0.0
        t0 = time.perf_counter()
        thread.join()
        if self._ward_error:
            self._ward_current = False
            raise RuntimeError(f"the ward's optimizer step failed: {self._ward_error.pop()!r}")
        return time.perf_counter() - t0

    def buddy_times(self) -> list[float]:
        return self.buddy_s

    def drop(self) -> None:
        self._join_ward()
        self.optimizer.zero_grad(set_to_none=True)
        self.ward_optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None
        self.reduced = None

    # ---- state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        self._join_ward()
        return {
            "own": {"param": self.own.detach(), "optim": self.optimizer.state_dict()},
            "ward": {"optim": self.ward_optimizer.state_dict()},
        }

    def state_for(self, dp_rank: int) -> dict[str, Any]:
        """The state of data-parallel rank ``dp_rank`` of this stage: this rank's or its buddy's."""
        self._join_ward()
        if dp_rank == self.dp_rank:
            return self.state()
        if dp_rank != self.buddy_dp:
            raise ValueError(
                f"dp rank {self.dp_rank} holds no state of dp rank {dp_rank} (its buddy is {self.buddy_dp})"
            )
        return {
            "own": {"param": self.ward.detach(), "optim": self.ward_optimizer.state_dict()},
            "ward": {"optim": self.optimizer.state_dict()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self._join_ward()
        param = state["own"]["param"]
        if param.data_ptr() != self.own.data_ptr():
            with torch.no_grad():
                self.own.copy_(param)
        self.optimizer.load_state_dict(state["own"]["optim"])
        self.ward_optimizer.load_state_dict(state["ward"]["optim"])
        self._ward_current = False  # the buddy's parameter slice comes with the next full all-gather

    def state_digest(self) -> str:
        """This rank's own slice: parameters and optimizer state (the buddy's copy is :meth:`ward_digest`)."""
        return state_digest(self.state()["own"])

    def ward_digest(self) -> str:
        """The buddy's slice as this rank holds it: equal to the buddy's :meth:`state_digest` when exact."""
        return state_digest(self.state_for(self.buddy_dp)["own"])

    def optimizer_bytes(self) -> int:
        self._join_ward()
        return tensor_bytes(self.optimizer.state_dict()["state"]) + tensor_bytes(
            self.ward_optimizer.state_dict()["state"]
        )

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The own slice as a flat dict (what a checkpoint of this slice saves)."""
        out = {"slice/param": self.own.detach()}
        for key, value in self.optimizer.state_dict()["state"].get(0, {}).items():
            out[f"slice/optim/{key}"] = torch.as_tensor(value)
        return out
