"""The Task protocol: what a user supplies to train with tmslurm.

Contract: a Task is a pure description of the model and data. tmslurm calls it to build the module of
one pipeline stage, its optimizer, the batch of (step, global micro-batch index) and the loss. A Task
must be deterministic: ``build_stage`` gives the same initial parameters for the same stage every
time (seed them from ``seed`` and the block index, not from global RNG state), and ``batch`` is a pure
function of its arguments. That is what lets a replacement rank compute bit-for-bit what the old one
would have. A Task raising an exception makes the rank fail like any crash (the run recovers).

Tensor parallelism: with ``parallel.tp > 1`` the spec carries the rank's TP position
(``tp_rank``, ``tp_size``) and ``tp_group`` (:class:`~tmslurm.train.tp.TPGroup`), the handle its
module reduces over. A Task opts in with a class attribute ``supports_tp = True``; a Task without it
is refused at ``tp > 1`` by config validation (a ConfigError naming ``parallel.tp``). A stage's
module may be reused (warm) for any stage of the same shape class and any TP position: its forward must depend only on
the role, the number of blocks and ``tp_group`` (parameter values are loaded at the switch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tmslurm.core.imports import import_class
from tmslurm.train.tp import TPGroup


@dataclass(frozen=True)
class StageSpec:
    """Where a stage sits: its index, the number of stages, its role, its block range and its TP position."""

    stage: int
    num_stages: int
    role: str
    blocks: range
    tp_rank: int = 0
    """This rank's tensor-parallel position (use it to cut the initial parameters)."""
    tp_size: int = 1
    """``parallel.tp``."""
    tp_group: TPGroup = field(default_factory=TPGroup, compare=False, repr=False)
    """The handle the module reduces over (rank and size as above; bound to a communicator per step)."""

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


class Task(Protocol):
    def build_stage(self, spec: StageSpec, device: torch.device) -> torch.nn.Module:
        """The module of one stage: first stage takes token ids, others take activations."""

    def build_optimizer(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        """The optimizer of one stage's parameters."""

    def batch(self, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of global micro-batch ``index`` at ``step``; pure function."""

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Scalar loss of the last stage's output."""

    def activation_shape(self, micro_batch_size: int) -> tuple[int, ...]:
        """Shape of the activations passed between stages (float32)."""


def load_task(cfg: Any) -> Task:
    """Build the Task named by ``train.task`` (``module:Class``) from the model and train configs."""
    return import_class(cfg.train.task, "train.task")(cfg.model, cfg.train)
