"""Stage communicators: what the pipeline schedule calls to move activations, gradients and reductions.

Contract: a :class:`StageComm` gives the schedule its operations (receive/send activations,
receive/send gradients, all-reduce the flat gradient over DP, all-reduce a tensor over the stage's
tensor-parallel group; and for the sharded optimizer, ``parallel.zero=1``: reduce-scatter the flat
gradient over DP, all-gather the flat parameters over DP, swap a slice with the data-parallel
buddy) and nothing else, so the same schedule runs

- over the real fabric (:class:`FabricStageComm`), where failures raise CommError/CommAborted;
- over the real fabric while *recording* the values that cross the stage boundary
  (:class:`RecordingStageComm`, used by designated ranks for the first step only, then off: zero
  steady-state cost);
- inside a standby's sandbox (:class:`SandboxStageComm`), where every value that would come from a
  peer is *replayed* from a recording and every send is skipped: the sandbox talks to nobody, and
  never invents zeros or random values that could produce NaNs. Its data-parallel all-reduce is the
  identity: the local gradient, computed from replayed values, stands in for the reduced one (only
  the reduction's shape is recorded). A missing or mismatched recording raises
  :class:`~tmslurm.core.errors.CommError` naming the file;
- alone (:class:`SoloStageComm`: one rank holding the whole model, dp = pp = tp = 1), for single-process
  benchmarks and tests: reductions are the identity and there is no peer to send to.

Tensor-parallel reductions are recorded and replayed like boundary values: the n-th ``tp_allreduce``
of a step is stored as ``tp/<n>`` (the schedule is deterministic, so the order is too), which is how
a standby warms a TP role without a TP peer.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

import torch

from tmslurm.comm.fabric import Fabric
from tmslurm.core.errors import CommError
from tmslurm.core.rundir import RunDir
from tmslurm.core.topology import Layout

log = logging.getLogger(__name__)


class StageComm(Protocol):
    def recv_act(self, micro: int) -> torch.Tensor: ...
    def send_act(self, t: torch.Tensor, micro: int) -> None: ...
    def recv_grad(self, micro: int) -> torch.Tensor: ...
    def send_grad(self, t: torch.Tensor, micro: int) -> None: ...
    def allreduce(self, flat: torch.Tensor) -> torch.Tensor: ...
    def tp_allreduce(self, t: torch.Tensor) -> torch.Tensor: ...
    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor: ...
    def all_gather(self, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor: ...
    def swap(self, t: torch.Tensor) -> torch.Tensor: ...
    def end_step(self) -> None: ...


GRAD_TAG = 100000
SWAP_TAG = 200000


class FabricStageComm:
    def __init__(
        self, fabric: Fabric, layout: Layout, rank: int, act_shape: tuple[int, ...], device: torch.device
    ) -> None:
        self.f = fabric
        self.prev = layout.pp_prev(rank)
        self.next = layout.pp_next(rank)
        c = layout.coord(rank)
        self.prev_rank = layout.rank(c.dp, c.stage - 1, c.tp) if self.prev else None
        self.next_rank = layout.rank(c.dp, c.stage + 1, c.tp) if self.next else None
        self.dp = layout.dp_group(rank) if layout.dp > 1 else None
        self.buddy = layout.buddy(rank) if layout.zero else None
        self.tp = layout.tp_group(rank)
        self.shape = act_shape
        self.device = device

    def recv_act(self, micro: int) -> torch.Tensor:
        group, peer = _peer(self.prev, self.prev_rank, "previous")
        buf = torch.empty(self.shape, device=self.device)
        return self.f.recv(group, buf, peer, micro)

    def send_act(self, t: torch.Tensor, micro: int) -> None:
        group, peer = _peer(self.next, self.next_rank, "next")
        self.f.send(group, t.detach().contiguous(), peer, micro)

    def recv_grad(self, micro: int) -> torch.Tensor:
        group, peer = _peer(self.next, self.next_rank, "next")
        buf = torch.empty(self.shape, device=self.device)
        return self.f.recv(group, buf, peer, GRAD_TAG + micro)

    def send_grad(self, t: torch.Tensor, micro: int) -> None:
        group, peer = _peer(self.prev, self.prev_rank, "previous")
        self.f.send(group, t.contiguous(), peer, GRAD_TAG + micro)

    def allreduce(self, flat: torch.Tensor) -> torch.Tensor:
        return flat if self.dp is None else self.f.allreduce(self.dp, flat)

    def tp_allreduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            raise CommError("tp_allreduce called in a layout with parallel.tp=1")
        return self.f.allreduce(self.tp, t)

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        return flat if self.dp is None else self.f.reduce_scatter(self.dp, flat)

    def all_gather(self, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        return flat if self.dp is None else self.f.all_gather(self.dp, flat, skip)

    def swap(self, t: torch.Tensor) -> torch.Tensor:
        """Send ``t`` to the data-parallel buddy and return the buddy's tensor of the same shape."""
        if self.dp is None or self.buddy is None:
            raise CommError("swap needs a data-parallel buddy (parallel.zero=1 with parallel.dp >= 2)")
        self.f.send(self.dp, t.contiguous(), self.buddy, SWAP_TAG)
        return self.f.recv(self.dp, torch.empty_like(t), self.buddy, SWAP_TAG)

    def end_step(self) -> None:
        self.f.flush_sends()


def recording_path(run_dir: str | Path, role: str) -> Path:
    return RunDir(Path(run_dir)).sandbox(role)


class RecordingStageComm:
    """Wraps the real communicator and records every incoming value of one step to a file."""

    def __init__(self, inner: FabricStageComm, path: Path) -> None:
        self.inner = inner
        self.path = path
        self.rec: dict[str, torch.Tensor] = {}
        self.tp_calls = 0

    def recv_act(self, micro: int) -> torch.Tensor:
        t = self.inner.recv_act(micro)
        self.rec[f"act/{micro}"] = t.detach().clone().cpu()
        return t

    def send_act(self, t: torch.Tensor, micro: int) -> None:
        self.inner.send_act(t, micro)

    def recv_grad(self, micro: int) -> torch.Tensor:
        t = self.inner.recv_grad(micro)
        self.rec[f"grad/{micro}"] = t.detach().clone().cpu()
        return t

    def send_grad(self, t: torch.Tensor, micro: int) -> None:
        self.inner.send_grad(t, micro)

    def allreduce(self, flat: torch.Tensor) -> torch.Tensor:
        out = self.inner.allreduce(flat)
        self.rec["allreduce"] = torch.tensor(out.shape)  # its shape only: a sandbox reduces to the identity
        return out

    def tp_allreduce(self, t: torch.Tensor) -> torch.Tensor:
        out = self.inner.tp_allreduce(t)
        self.rec[f"tp/{self.tp_calls}"] = out.detach().clone().cpu()
        self.tp_calls += 1
        return out

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        out = self.inner.reduce_scatter(flat)
        self.rec["reduce_scatter"] = out.detach().clone().cpu()
        return out

    def all_gather(self, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        out = self.inner.all_gather(flat, skip)
        self.rec["all_gather"] = out.detach().clone().cpu()
        return out

    def swap(self, t: torch.Tensor) -> torch.Tensor:
        out = self.inner.swap(t)
        self.rec["swap"] = out.detach().clone().cpu()
        return out

    def end_step(self) -> None:
        self.inner.end_step()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save(self.rec, tmp)
        os.replace(tmp, self.path)
        log.info("recorded %d boundary values to %s", len(self.rec), self.path)


class SandboxStageComm:
    """Answers every boundary-crossing operation from a recording; sends are skipped."""

    def __init__(self, path: Path, device: torch.device) -> None:
        try:
            self.rec = torch.load(path, weights_only=True)
        except Exception as exc:
            raise CommError(f"sandbox recording {path} is unreadable: {exc}") from None
        self.path = path
        self.device = device
        self.sent = 0
        self.tp_calls = 0

    def _get(self, key: str) -> torch.Tensor:
        try:
            return self.rec[key].to(self.device).clone()
        except KeyError:
            raise CommError(
                f"sandbox recording {self.path} has no value for {key!r} (recorded with another layout?)"
            ) from None

    def recv_act(self, micro: int) -> torch.Tensor:
        return self._get(f"act/{micro}")

    def send_act(self, t: torch.Tensor, micro: int) -> None:
        self.sent += 1

    def recv_grad(self, micro: int) -> torch.Tensor:
        return self._get(f"grad/{micro}")

    def send_grad(self, t: torch.Tensor, micro: int) -> None:
        self.sent += 1

    def allreduce(self, flat: torch.Tensor) -> torch.Tensor:
        """The identity: the local gradient stands in for the reduced one (same shape, same kernels after
        it; a warm runner's values mean nothing until a join loads its state). Holding the recorded reduction
        and a copy of it would add two flat gradients to a standby's peak RSS (1.4 GB at model=large)."""
        if "allreduce" in self.rec and tuple(self.rec["allreduce"].tolist()) != tuple(flat.shape):
            raise CommError(
                f"sandbox recording {self.path}: all-reduce shape {tuple(self.rec['allreduce'].tolist())} "
                f"!= {tuple(flat.shape)}"
            )
        return flat

    def tp_allreduce(self, t: torch.Tensor) -> torch.Tensor:
        out = self._get(f"tp/{self.tp_calls}")
        self.tp_calls += 1
        if out.shape != t.shape:
            raise CommError(
                f"sandbox recording {self.path}: tp all-reduce shape {tuple(out.shape)} != {tuple(t.shape)}"
            )
        return out

    def _same_shape(self, key: str, like: torch.Tensor) -> torch.Tensor:
        out = self._get(key)
        if out.shape != like.shape:
            raise CommError(f"sandbox recording {self.path}: {key} shape {tuple(out.shape)} != {tuple(like.shape)}")
        return out

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        out = self._get("reduce_scatter")
        if flat.numel() % out.numel():
            raise CommError(
                f"sandbox recording {self.path}: reduce-scatter chunk {out.numel()} does not divide {flat.numel()}"
            )
        return out

    def all_gather(self, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        got = self._same_shape("all_gather", flat)
        if skip is not None:  # that region is left to the thread writing it, as on the fabric
            size = self._get("reduce_scatter").numel()  # one slice
            got[skip * size : (skip + 1) * size] = flat[skip * size : (skip + 1) * size]
        flat.copy_(got)
        return flat

    def swap(self, t: torch.Tensor) -> torch.Tensor:
        return self._same_shape("swap", t)

    def end_step(self) -> None:
        self.tp_calls = 0


class SoloStageComm:
    """One rank, the whole model (dp = pp = tp = 1): reductions are the identity; peer operations raise."""

    def recv_act(self, micro: int) -> torch.Tensor:
        raise CommError("SoloStageComm has no upstream stage (pp must be 1)")

    def send_act(self, t: torch.Tensor, micro: int) -> None:
        raise CommError("SoloStageComm has no downstream stage (pp must be 1)")

    def recv_grad(self, micro: int) -> torch.Tensor:
        raise CommError("SoloStageComm has no downstream stage (pp must be 1)")

    def send_grad(self, t: torch.Tensor, micro: int) -> None:
        raise CommError("SoloStageComm has no upstream stage (pp must be 1)")

    def allreduce(self, flat: torch.Tensor) -> torch.Tensor:
        return flat

    def tp_allreduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        return flat

    def all_gather(self, flat: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        return flat

    def swap(self, t: torch.Tensor) -> torch.Tensor:
        raise CommError("SoloStageComm has no data-parallel buddy (dp must be 1)")

    def end_step(self) -> None:
        return None


def _peer(group: str | None, rank: int | None, side: str) -> tuple[str, int]:
    """The pipeline link to the ``side`` stage; a schedule that uses a link its stage lacks is a bug."""
    if group is None or rank is None:
        raise CommError(f"this pipeline stage has no {side} stage to exchange with")
    return group, rank
