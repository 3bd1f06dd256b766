"""A Hugging Face decoder-only causal LM, unchanged, as a tmslurm Task (``pip install tmslurm[hf]``).

Contract: ``train.task=tmslurm.train.hf:CausalLMTask model.hf_config=<config.json | preset>`` trains
the architecture that config describes (Llama-architecture models: llama, mistral, qwen2 with RoPE,
RMSNorm, SwiGLU and grouped-query attention; and GPT-2), built from the config with transformers'
own classes, never downloaded. Each stage is the model's own base model (``LlamaModel``,
``GPT2Model``) built with only the stage's blocks: the first stage keeps the token embedding (and
GPT-2's position table), the last stage the final norm and ``lm_head``; a later stage feeds the
incoming activations as ``inputs_embeds``, so masks, rotary embeddings and the blocks' forward are
transformers' code. GPT-2 adds its position table inside its base model: on later stages it is
replaced by zeros, and ``x + 0`` is exact. Parameters are float32 whatever the config's dtype.

Determinism: every embedding, block, norm and head is initialised from its own generator seeded by
(``train.seed``, part), with the architecture's rule (normal(0, ``initializer_range``) weights,
zero biases, unit norms; GPT-2's residual projections scaled by 1/sqrt(2 n_layer)), so initial
parameters do not depend on the split and a replacement rank rebuilds exactly the same module.
Training has no dropout (refused at config time, with tied embeddings and tensor parallelism).

Data: ``train.data_path`` (or the standard library's sources) tokenized by ``model.hf_tokenizer``
(a local ``tokenizer.json``, loaded with the tokenizers library) or, without one, fed as bytes.

Failure behaviour: transformers missing, an architecture whose base model has parameters outside
those parts, or a tokenizer whose ids exceed the config's vocabulary raise ConfigError naming the fix.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

from tmslurm.core.config import ModelConfig, TrainConfig
from tmslurm.core.errors import ConfigError
from tmslurm.core.hfconfig import HFModel, read_hf_config
from tmslurm.train.data import TokenCorpus, load_corpus
from tmslurm.train.model import CorpusLM
from tmslurm.train.task import StageSpec

EMBED, POSITIONS, NORM, HEAD, BLOCK0 = 1, 2, 3, 4, 10
"""Seed keys of the parts (block b uses BLOCK0 + b), as in the reference Task."""


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "train.task=tmslurm.train.hf:CausalLMTask needs transformers. Fix: pip install 'tmslurm[hf]'."
        ) from None
    return transformers


class _NoPositions(nn.Module):
    """Stands in for GPT-2's position table on later stages: adds nothing (``x + 0`` is exact)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*position_ids.shape, self.width, device=position_ids.device)


class HFStage(nn.Module):
    """One stage: the architecture's base model with this stage's blocks, and the head on the last stage."""

    def __init__(self, full: Any, hf: HFModel, spec: StageSpec) -> None:
        """``full``: the architecture's whole transformers model (a ``PreTrainedModel``; typed Any, as
        transformers is imported only when a run uses it)."""
        super().__init__()
        self.first = spec.is_first
        self.body = getattr(full, full.base_model_prefix)
        family = hf.family
        if not spec.is_first:
            setattr(self.body, family.embed, None)
            if family.positions is not None:
                setattr(self.body, family.positions, _NoPositions(hf.width))
        if not spec.is_last:
            setattr(self.body, family.norm, nn.Identity())
        self.head = full.lm_head if spec.is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = {"input_ids": x} if self.first else {"inputs_embeds": x}
        hidden = self.body(**inputs, use_cache=False).last_hidden_state
        return hidden if self.head is None else self.head(hidden)


def _init_(module: nn.Module, seed: int, key: int, std: float, scaled: tuple[str, ...], n_layer: int) -> set[int]:
    """Fill ``module``'s parameters from a generator seeded by (seed, key); returns the ids it filled."""
    gen = torch.Generator().manual_seed(seed * 100003 + key)
    done = set()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                scale = std / math.sqrt(2 * n_layer) if name.endswith(scaled) else std
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            done.add(id(p))
    return done


@lru_cache(maxsize=2)
def _token_ids(data_path: str | None, tokenizer: str | None) -> np.ndarray:
    raw = load_corpus(data_path)
    if tokenizer is None:
        return raw
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(tokenizer).encode(raw.tobytes().decode("utf-8", errors="replace")).ids
    return np.asarray(ids, dtype=np.int64)


class CausalLMTask(CorpusLM):
    """A Hugging Face causal LM from ``model.hf_config``; AdamW (or SGD) over its stage's parameters."""

    def __init__(self, model: ModelConfig, train: TrainConfig) -> None:
        if model.hf_config is None:
            raise ConfigError(
                "train.task=tmslurm.train.hf:CausalLMTask needs a model. Fix: pass "
                "model.hf_config=<config.json or a preset: llama-tiny, gpt2-tiny>."
            )
        self.m = model
        self.t = train
        self.hf = read_hf_config(model.hf_config)
        ids = _token_ids(train.data_path, model.hf_tokenizer)
        if len(ids) and int(ids.max()) >= self.hf.vocab:
            raise ConfigError(
                f"token id {int(ids.max())} is outside the model's vocab_size={self.hf.vocab}. Fix: pass "
                "model.hf_tokenizer=<the model's tokenizer.json>, or use a config with a larger vocab_size."
            )
        self.corpus = TokenCorpus(ids, model.seq_len, train.micro_batch_size, train.seed)

    def _stage_config(self, n_blocks: int, blocks: range):
        fields = dict(self.hf.fields)
        fields[self.hf.family.layers] = n_blocks
        if isinstance(fields.get("layer_types"), list):
            fields["layer_types"] = [fields["layer_types"][b] for b in blocks]
        for key in ("dtype", "torch_dtype", "auto_map", "transformers_version", "_name_or_path"):
            fields.pop(key, None)
        model_type = fields.pop("model_type")
        config = _transformers().AutoConfig.for_model(model_type, **fields)
        config.use_cache = False
        return config

    def build_stage(self, spec: StageSpec, device: torch.device) -> nn.Module:
        tf = _transformers()
        config = self._stage_config(len(spec.blocks), spec.blocks)
        full = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
        stage = HFStage(full, self.hf, spec)
        self._init_stage(stage, spec)
        stage = stage.to(device)
        if self.m.compile:
            # torch's way to compile one module's forward; mypy forbids assigning to a method
            stage.forward = torch.compile(stage.forward, dynamic=False)  # type: ignore[method-assign]
        return stage

    def _init_stage(self, stage: HFStage, spec: StageSpec) -> None:
        family, body = self.hf.family, stage.body
        std = float(self.hf.fields.get("initializer_range", 0.02))

        def fill(module: nn.Module, key: int) -> set[int]:
            return _init_(module, self.t.seed, key, std, family.scaled, self.hf.n_layer)

        done: set[int] = set()
        if spec.is_first:
            done |= fill(getattr(body, family.embed), EMBED)
            if family.positions is not None:
                done |= fill(getattr(body, family.positions), POSITIONS)
        layers = body.get_submodule("layers" if hasattr(body, "layers") else "h")
        for block, layer in zip(spec.blocks, layers):
            done |= fill(layer, BLOCK0 + block)
        if spec.is_last:
            done |= fill(getattr(body, family.norm), NORM)
            if stage.head is not None:  # always set on the last stage
                done |= fill(stage.head, HEAD)
        missed = [name for name, p in stage.named_parameters() if id(p) not in done]
        if missed:
            raise ConfigError(
                f"model.hf_config={self.m.hf_config!r}: CausalLMTask does not know how to initialise "
                f"{', '.join(missed[:4])}. Fix: use a plain {self.hf.model_type} config."
            )

    def activation_shape(self, micro_batch_size: int) -> tuple[int, ...]:
        return (micro_batch_size, self.m.seq_len, self.hf.width)
