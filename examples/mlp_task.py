"""A user's own Task: a residual MLP regressing a fixed random function, split into pipeline stages.

Run it from the repository root (the launcher imports the class to validate ``train.task``, and
the console script does not put the current directory on ``sys.path``, hence ``PYTHONPATH=.``)::

    PYTHONPATH=. tmslurm-launch cluster=local train.task=examples.mlp_task:MlpTask \\
        parallel.dp=2 parallel.pp=2 train.steps=20

What it shows (see docs/task.md):

- ``build_stage`` builds only the blocks of ``spec.blocks``; the first stage adds the input
  projection, the last the output head. Every block is initialised from its own
  ``torch.Generator`` seeded by (seed, block index), so a stage's initial parameters do not depend
  on how the model is split, and a replacement rank rebuilds exactly the same module.
- ``batch(step, index)`` is a pure function: a generator seeded from (seed, step, index) draws the
  inputs; the targets are a fixed function of them (its weights are seeded by ``seed`` alone).
- ``activation_shape`` is what every stage boundary carries: ``(micro_batch_size, d_model)``.

Sizes come from the ``model`` config group: ``model.n_layer`` residual blocks of width
``model.d_model`` (``n_head``, ``seq_len`` and ``vocab`` are not used by this task).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tmslurm.core.config import ModelConfig, TrainConfig
from tmslurm.train.task import StageSpec

IN_FEATURES = 16
OUT_FEATURES = 1
_MASK = (1 << 63) - 1


def _seed(*parts: int) -> int:
    """Mix integers into one 63-bit generator seed (a pure function of its arguments)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (p & _MASK)) * 0x100000001B3 & _MASK
        h ^= h >> 29
    return h


def _init_(module: nn.Module, seed: int) -> None:
    """Deterministic init from a private generator: weights ~ N(0, 1/fan_in), biases 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


class Block(nn.Module):
    """Pre-norm residual MLP block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class MlpStage(nn.Module):
    """One pipeline stage: [input projection] + blocks + [norm and head]."""

    def __init__(self, spec: StageSpec, width: int) -> None:
        super().__init__()
        self.spec = spec
        if spec.is_first:
            self.inp = nn.Linear(IN_FEATURES, width)
        self.blocks = nn.ModuleList(Block(width) for _ in spec.blocks)
        if spec.is_last:
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, OUT_FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.is_first:
            x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        if self.spec.is_last:
            x = self.head(self.norm(x))
        return x


class MlpTask:
    """Regression of y = sin(x A) . b on x ~ N(0, I); built as ``MlpTask(model_config, train_config)``."""

    def __init__(self, model: ModelConfig, train: TrainConfig) -> None:
        self.width = model.d_model
        self.t = train
        gen = torch.Generator().manual_seed(_seed(train.seed, 7))
        self.a = torch.randn(IN_FEATURES, 8, generator=gen)
        self.b = torch.randn(8, OUT_FEATURES, generator=gen) / 8**0.5

    def build_stage(self, spec: StageSpec, device: torch.device) -> nn.Module:
        stage = MlpStage(spec, self.width)
        if spec.is_first:
            _init_(stage.inp, _seed(self.t.seed, 1))
        for block_index, block in zip(spec.blocks, stage.blocks):
            _init_(block, _seed(self.t.seed, 100 + block_index))
        if spec.is_last:
            _init_(stage.norm, _seed(self.t.seed, 2))
            _init_(stage.head, _seed(self.t.seed, 3))
        return stage.to(device)

    def build_optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        if self.t.optimizer == "sgd":
            return torch.optim.SGD(module.parameters(), lr=self.t.lr * 30, momentum=0.9, foreach=False)
        return torch.optim.AdamW(module.parameters(), lr=self.t.lr, weight_decay=self.t.weight_decay, foreach=False)

    def batch(self, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(_seed(self.t.seed, step, index))
        x = torch.randn(self.t.micro_batch_size, IN_FEATURES, generator=gen)
        return x, torch.sin(x @ self.a) @ self.b

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, targets)

    def activation_shape(self, micro_batch_size: int) -> tuple[int, ...]:
        return (micro_batch_size, self.width)
