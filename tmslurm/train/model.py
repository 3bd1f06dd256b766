"""The reference Task: a small GPT-style byte-level language model split into pipeline stages.

Contract: the first stage holds token + position embeddings and its blocks, middle stages hold blocks,
the last stage holds its blocks, the final LayerNorm and the head. Every block and embedding is
initialised from its own generator seeded by (seed, block index), so a stage's initial parameters do
not depend on how the model is split, and a DP1 x PP1 run starts from the same weights as DP2 x PP2.
No dropout: training is deterministic given the data. ``model.compile`` wraps each stage module in
``torch.compile`` (warm-up is then real work, which is what standbys exist to hide).

Tensor parallelism (``parallel.tp``, Megatron style): ``qkv`` and ``fc`` are column-parallel (each
TP rank holds the q, k, v rows of its ``n_head / tp`` heads and its ``4 d / tp`` hidden units),
``proj`` and ``out`` are row-parallel (the matching weight columns; their bias is kept whole and
added after the reduction). Per block, forward reduces twice (after attention and after the MLP)
and backward twice (the gradients entering ``qkv`` and ``fc``). LayerNorms, embeddings and the head
are replicated: every TP rank computes them identically. Initial parameters do not depend on
``tp``: the full block is initialised exactly as at ``tp = 1`` and each rank keeps its shard
(:func:`merge_tp_shards` puts them back together). With ``tp = 1`` the code path is unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tmslurm.core.config import ModelConfig, TrainConfig
from tmslurm.train.data import ByteCorpus, TokenCorpus
from tmslurm.train.task import StageSpec
from tmslurm.train.tp import TPGroup, copy_to_tp, reduce_from_tp, shard_cols, shard_rows, unshard_cols, unshard_rows


class Block(nn.Module):
    """One transformer block; with a TP group of size > 1, this rank's heads and hidden units only."""

    def __init__(self, d_model: int, n_head: int, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.tp = tp or TPGroup()
        size = self.tp.size
        self.n_head = n_head // size
        self.head_dim = d_model // n_head
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model // size)
        self.proj = nn.Linear(d_model // size, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model // size)
        self.out = nn.Linear(4 * d_model // size, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size > 1:
            return self._forward_tp(x)
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

    def _forward_tp(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        width = self.n_head * self.head_dim  # this rank's share of d_model
        q, k, v = self.qkv(copy_to_tp(self.ln1(x), self.tp)).split(width, dim=2)
        shape = (b, t, self.n_head, self.head_dim)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, width)
        x = x + (reduce_from_tp(F.linear(att, self.proj.weight), self.tp) + self.proj.bias)
        h = F.gelu(self.fc(copy_to_tp(self.ln2(x), self.tp)))
        return x + (reduce_from_tp(F.linear(h, self.out.weight), self.tp) + self.out.bias)


# Parameters cut by TP: name suffix -> (dimension kind, parts). Everything else is replicated.
_SHARDED = {
    "qkv.weight": ("rows", 3),
    "qkv.bias": ("rows", 3),
    "fc.weight": ("rows", 1),
    "fc.bias": ("rows", 1),
    "proj.weight": ("cols", 1),
    "out.weight": ("cols", 1),
}


def _shard_of(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    kind = next((v for k, v in _SHARDED.items() if name.endswith(k)), None)
    if kind is None:
        return full.clone()
    return shard_rows(full, rank, size, kind[1]) if kind[0] == "rows" else shard_cols(full, rank, size)


def merge_tp_shards(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One stage's full state dict from its TP ranks' state dicts (rank order); replicated entries from rank 0."""
    out = {}
    for name, t in shards[0].items():
        kind = next((v for k, v in _SHARDED.items() if name.endswith(k)), None)
        parts = [sd[name] for sd in shards]
        if kind is None:
            out[name] = t
        else:
            out[name] = unshard_rows(parts, kind[1]) if kind[0] == "rows" else unshard_cols(parts)
    return out


class Stage(nn.Module):
    """One pipeline stage of the reference GPT."""

    def __init__(self, spec: StageSpec, m: ModelConfig) -> None:
        super().__init__()
        self.spec = spec
        if spec.is_first:
            self.tok = nn.Embedding(m.vocab, m.d_model)
            self.pos = nn.Embedding(m.seq_len, m.d_model)
        self.blocks = nn.ModuleList(Block(m.d_model, m.n_head, spec.tp_group) for _ in spec.blocks)
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


class CorpusLM:
    """What the language-model Tasks share: ``train.optimizer`` (AdamW, or SGD with momentum at lr x 30)
    over a stage's parameters, the batches of ``self.corpus`` and next-token cross entropy."""

    t: TrainConfig
    corpus: TokenCorpus

    def build_optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        if self.t.optimizer == "sgd":
            return torch.optim.SGD(module.parameters(), lr=self.t.lr * 30, momentum=0.9, foreach=False)
        return torch.optim.AdamW(module.parameters(), lr=self.t.lr, weight_decay=self.t.weight_decay, foreach=False)

    def batch(self, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.corpus.batch(step, index)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


class ReferenceTask(CorpusLM):
    """GPT-style byte-level LM over :class:`ByteCorpus`; AdamW; sizes from ``model`` presets; tensor-parallel."""

    supports_tp = True

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
            if spec.tp_size == 1:
                _init_(block, self.t.seed, 10 + block_index)
                continue
            full = Block(self.m.d_model, self.m.n_head)  # initialised as at tp = 1, then cut
            _init_(full, self.t.seed, 10 + block_index)
            with torch.no_grad():
                for name, p in block.named_parameters():
                    p.copy_(_shard_of(name, dict(full.named_parameters())[name], spec.tp_rank, spec.tp_size))
        if spec.is_last:
            _init_(stage.ln_f, self.t.seed, 3)
            _init_(stage.head, self.t.seed, 4)
        stage = stage.to(device)
        if self.m.compile:
            # torch's way to compile one module's forward; mypy forbids assigning to a method
            stage.forward = torch.compile(stage.forward, dynamic=False)  # type: ignore[method-assign]
        return stage

    def activation_shape(self, micro_batch_size: int) -> tuple[int, ...]:
        return (micro_batch_size, self.m.seq_len, self.m.d_model)
