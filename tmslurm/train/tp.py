"""Tensor parallelism for a Task's module: the TP group handle and Megatron's two autograd operators.

Contract:
- :class:`TPGroup` is what a Task's stage module holds to talk to its tensor-parallel peers: its
  ``rank`` (TP position), its ``size`` and :meth:`TPGroup.all_reduce` (SUM over the TP group, returns
  the reduced tensor). The handle is *bound* by the runner to the step's stage communicator before
  every step, so the same module talks to the real ``tp/replica{i}/stage{j}`` group in a rank, to a
  recording in a standby's sandbox, and to nobody when ``size == 1`` (the reduction is the identity
  and is never issued). A standby's warm module may later serve another TP position: the runner
  then rebinds ``rank``; a module must therefore not bake its TP rank into its forward.
- :func:`copy_to_tp` (Megatron's *f*) is the identity forward and all-reduces the gradient backward;
  put it in front of a column-parallel layer. :func:`reduce_from_tp` (*g*) all-reduces forward and is
  the identity backward; put it after a row-parallel layer. A block with a column/row pair in
  attention and in the MLP issues two all-reduces forward and two backward.
- :func:`shard_rows` / :func:`shard_cols` cut a full tensor into this rank's part, so a Task can
  initialise the *full* parameters exactly as with ``tp = 1`` and keep only its shard (initial
  parameters that do not depend on ``tp``).
- A failed or aborted reduction raises the communicator's CommError / CommAborted out of forward or
  backward; the runner drops the step's gradients like for any communication failure. Calling
  :meth:`TPGroup.all_reduce` on an unbound group with ``size > 1`` raises RuntimeError.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


class TPGroup:
    """A Task module's handle on its tensor-parallel group (rank, size, all_reduce)."""

    def __init__(self, rank: int = 0, size: int = 1) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"TP rank {rank} outside a group of size {size}")
        self.rank = rank
        self.size = size
        self._comm: Any = None

    def bind(self, comm: Any) -> None:
        """Route reductions to ``comm.tp_allreduce`` (a StageComm) from now on."""
        self._comm = comm

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return t
        if self._comm is None:
            raise RuntimeError("TPGroup.all_reduce called before the runner bound a communicator")
        return self._comm.tp_allreduce(t.contiguous())


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TPGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.all_reduce(grad.clone()), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TPGroup) -> torch.Tensor:
        return group.all_reduce(x.clone())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Megatron *f*: identity forward, all-reduce of the gradient backward (before a column-parallel layer)."""
    return x if group.size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Megatron *g*: all-reduce forward, identity backward (after a row-parallel layer)."""
    return x if group.size == 1 else _ReduceFromTP.apply(x, group)


def shard_rows(full: torch.Tensor, rank: int, size: int, parts: int = 1) -> torch.Tensor:
    """This rank's rows of ``full``; with ``parts`` > 1 (e.g. 3 for a fused q|k|v) each part is cut alike."""
    chunks = full.chunk(parts, dim=0)
    return torch.cat([c.chunk(size, dim=0)[rank] for c in chunks], dim=0).clone()


def shard_cols(full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's columns (last dimension) of ``full``."""
    return full.chunk(size, dim=-1)[rank].clone()


def unshard_rows(parts_by_rank: list[torch.Tensor], parts: int = 1) -> torch.Tensor:
    """Inverse of :func:`shard_rows` over every rank's shard (rank order)."""
    per_rank = [p.chunk(parts, dim=0) for p in parts_by_rank]
    return torch.cat([torch.cat([r[k] for r in per_rank], dim=0) for k in range(parts)], dim=0)


def unshard_cols(parts_by_rank: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts_by_rank, dim=-1)
