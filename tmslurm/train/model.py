"""The reference Task: a small GPT-style byte-level language model split into pipeline stages.

Contract: the first stage holds token + position embeddings and its blocks, middle stages hold blocks,
the last stage holds its blocks, the final LayerNorm and the head. Every block and embedding is
initialised from its own generator seeded by (seed, block index), so a stage's initial parameters do
not depend on how the model is split, and a DP1 x PP1 run starts from the same weights as DP2 x PP2.
No dropout: training is deterministic given the data. ``model.compile`` wraps each stage module in
``torch.compile`` (warm-up is then real work, which is what standbys exist to hide).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tmslurm.config import ModelConfig, TrainConfig
from tmslurm.train.data import ByteCorpus
from tmslurm.train.task import StageSpec


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Stage(nn.Module):
    """One pipeline stage of the reference GPT."""

    def __init__(self, spec: StageSpec, m: ModelConfig) -> None:
        super().__init__()
        self.spec = spec
        if spec.is_first:
            self.tok = nn.Embedding(m.vocab, m.d_model)
            self.pos = nn.Embedding(m.seq_len, m.d_model)
        self.blocks = nn.ModuleList(Block(m.d_model, m.n_head) for _ in spec.blocks)
        if spec.is_last:
            self.ln_f = nn.LayerNorm(m.d_model)
            self.head = nn.Linear(m.d_model, m.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok(x) + self.pos(pos)[None]
        for block in self.blocks:
            x = block(x)
        if self.spec.is_last:
            x = self.head(self.ln_f(x))
        return x


def _init_(module: nn.Module, seed: int, key: int) -> None:
    gen = torch.Generator().manual_seed(seed * 100003 + key)
    for name, p in module.named_parameters():
        with torch.no_grad():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if p.dim() == 2 else 1.0))
    for name, p in module.named_parameters():
        if name.endswith("out.weight") or name.endswith("proj.weight"):
            with torch.no_grad():
                p.mul_(1.0 / math.sqrt(2.0))


class ReferenceTask:
    """GPT-style byte-level LM over :class:`ByteCorpus`; AdamW; sizes from ``model`` presets."""

    def __init__(self, model: ModelConfig, train: TrainConfig) -> None:
        self.m = model
        self.t = train
        self.corpus = ByteCorpus(train.data_path, model.seq_len, train.micro_batch_size, train.seed)

    def build_stage(self, spec: StageSpec, device: torch.device) -> nn.Module:
        stage = Stage(spec, self.m)
        if spec.is_first:
            _init_(stage.tok, self.t.seed, 1)
            _init_(stage.pos, self.t.seed, 2)
        for block_index, block in zip(spec.blocks, stage.blocks):
            _init_(block, self.t.seed, 10 + block_index)
        if spec.is_last:
            _init_(stage.ln_f, self.t.seed, 3)
            _init_(stage.head, self.t.seed, 4)
        stage = stage.to(device)
        if self.m.compile:
            stage.forward = torch.compile(stage.forward, dynamic=False)
        return stage

    def build_optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        if self.t.optimizer == "sgd":
            return torch.optim.SGD(module.parameters(), lr=self.t.lr * 30, momentum=0.9, foreach=False)
        return torch.optim.AdamW(module.parameters(), lr=self.t.lr, weight_decay=self.t.weight_decay, foreach=False)

    def batch(self, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.corpus.batch(step, index)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))

    def activation_shape(self, micro_batch_size: int) -> tuple[int, ...]:
        return (micro_batch_size, self.m.seq_len, self.m.d_model)
