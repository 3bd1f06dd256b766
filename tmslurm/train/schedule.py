"""One pipeline stage's training step: GPipe over a StageComm, then the data-parallel reduction.

Contract: :meth:`StageRunner.compute` runs the forward and backward passes of all M micro-batches of
one step (all forwards, then all backwards, in micro-batch order), all-reduces the flat gradient in
the stage's data-parallel group (SUM; each micro-batch loss is pre-scaled by 1/(M*dp), so the sum is
the mean) and leaves the result in ``.grad``. It does NOT apply the optimizer: the caller does that
with :meth:`apply` only after the run decided the step commits, or :meth:`drop` on abort. Any
communication failure propagates as CommError/CommAborted with the gradients left to be dropped; so
does the CommAborted that ``compute``'s ``stop`` raises between two layers once the run aborts the step
(:mod:`tmslurm.train.abortpoints`).
Before each step the stage's TP handle (``spec.tp_group``) is bound to the step's communicator, so
the module's tensor-parallel reductions go wherever the step's boundary values go (the fabric, a
recording, a sandbox). :meth:`retarget` lets a warm runner serve another stage of its shape class
and another TP position; the caller then loads that stage's state.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from tmslurm.comm.stage_comm import StageComm
from tmslurm.train.abortpoints import AbortPoints, Stop
from tmslurm.train.task import StageSpec, Task


class StageRunner:
    def __init__(
        self, task: Task, spec: StageSpec, dp_rank: int, dp: int, micro_batches: int, device: torch.device
    ) -> None:
        self.task = task
        self.spec = spec
        self.dp_rank = dp_rank
        self.dp = dp
        self.m = micro_batches
        self.device = device
        self.module = task.build_stage(spec, device)
        self.optimizer = task.build_optimizer(self.module)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.points = AbortPoints(self.module)
        """Where a step stops between layers once ``compute``'s ``stop`` raises (train/abortpoints.py)."""
        self.reduced: torch.Tensor | None = None
        """This step's reduced flat gradient (``.grad`` are views of it), from ``compute`` until ``apply`` or
        ``drop``: what a shadow follows."""

    def compute(
        self, step: int, comm: StageComm, midstep: Callable[[], None] | None = None, stop: Stop | None = None
    ) -> float | None:
        """Forward + backward + reduction of one step; returns the step loss on the last stage.

        ``midstep`` (fault injection) is called between the forward and the backward passes. ``stop`` is
        called between layers and raises to abandon the step (an abort).
        """
        with self.points.armed(stop):
            return self._compute(step, comm, midstep)

    def _compute(self, step: int, comm: StageComm, midstep: Callable[[], None] | None) -> float | None:
        self.spec.tp_group.bind(comm)
        scale = 1.0 / (self.m * self.dp)
        outs, ins, loss_sum = [], [], 0.0
        for micro in range(self.m):
            index = self.dp_rank * self.m + micro
            if self.spec.is_first:
                x = self.task.batch(step, index)[0].to(self.device)
            else:
                x = comm.recv_act(micro).requires_grad_()
            y = self.module(x)
            if self.spec.is_last:
                loss = self.task.loss(y, self.task.batch(step, index)[1].to(self.device)) * scale
                loss_sum += float(loss.detach())
                outs.append(loss)
            else:
                comm.send_act(y, micro)
                outs.append(y)
            ins.append(x)
        if midstep is not None:
            midstep()
        for micro in range(self.m):
            if self.spec.is_last:
                outs[micro].backward()
            else:
                outs[micro].backward(comm.recv_grad(micro))
            if not self.spec.is_first:
                grad = ins[micro].grad
                assert grad is not None  # a later stage's input requires grad
                comm.send_grad(grad, micro)
        self._reduce(comm)
        comm.end_step()
        return loss_sum * self.dp if self.spec.is_last else None

    def _reduce(self, comm: StageComm) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = _flatten_dense_tensors(grads)
        flat = comm.allreduce(flat)
        self.reduced = flat
        for p, g in zip(self.params, _unflatten_dense_tensors(flat, grads)):
            p.grad = g

    def retarget(self, spec: StageSpec, dp_rank: int) -> None:
        """Serve ``spec`` (same shape class) as data-parallel rank ``dp_rank``; gradients are dropped."""
        group = self.spec.tp_group
        group.rank = spec.tp_rank
        self.spec = dataclasses.replace(spec, tp_group=group)
        self.dp_rank = dp_rank
        self.drop()

    def apply(self) -> None:
        self.optimizer.step()
        self.drop()

    def drop(self) -> None:
        """Forget the step's gradients, the reduced flat one included: held into the next step, it was
        a third flat gradient at that step's reduction peak (455 MB per rank at model=large)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.reduced = None

    def host_slots(self) -> Iterator[tuple[Any, torch.Tensor]]:
        """Host parameters, then host optimizer moments (0-dim step counts excluded), as the standby
        arena re-binds them: (the Parameter, its data) or ((the optimizer state dict, key), tensor)."""
        for p in self.params:
            if p.device.type == "cpu":
                yield p, p.data
        yield from optimizer_slots(self.optimizer, self.params)

    def gather(self, comm: StageComm) -> None:
        """Make every parameter current; a no-op here (the sharded runner all-gathers)."""

    def state(self) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "optim": self.optimizer.state_dict()}

    def state_for(self, dp_rank: int) -> dict[str, Any]:
        """The state data-parallel rank ``dp_rank`` of this stage needs: the same as ours (replicas)."""
        return self.state()

    def ward_digest(self) -> str | None:
        """The digest of a buddy's slice this rank holds (only with a sharded optimizer)."""
        return None

    def buddy_times(self) -> list[float]:
        """Seconds the buddy copy cost per committed step (only with a sharded optimizer)."""
        return []

    def optimizer_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        return tensor_bytes(self.optimizer.state_dict()["state"])

    def load_state(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])

    def digest(self) -> str:
        return params_digest(self.module)

    def state_digest(self) -> str:
        """Parameters and optimizer state (moments, step counts): two different states never match."""
        return state_digest(self.state())

    def state_bytes(self) -> int:
        """Bytes of parameters and optimizer state (what a state transfer moves)."""
        return tensor_bytes(self.state())


def optimizer_slots(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
) -> Iterator[tuple[Any, torch.Tensor]]:
    """((state dict, key), tensor) of every host moment of ``params`` in ``optimizer`` (not 0-dim counts)."""
    for p in params:
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device.type == "cpu":
                yield (state, key), value


def params_digest(module: torch.nn.Module) -> str:
    return named_digest(module.state_dict())


def named_digest(named: dict[str, torch.Tensor]) -> str:
    """sha256 over (name, bytes) of named tensors in name order: :func:`params_digest` of a state dict."""
    h = hashlib.sha256()
    for name, p in sorted(named.items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor in a nested state (dicts, lists, tuples)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def state_digest(state: Any) -> str:
    """sha256 over a nested state (dicts in key order, lists in order, tensors by dtype, shape, bytes)."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())
