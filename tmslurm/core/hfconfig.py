"""Hugging Face model configs for :class:`~tmslurm.train.hf.CausalLMTask`, read without transformers.

Contract: ``model.hf_config`` names a ``config.json`` (a path, relative to where the run is launched)
or a named preset (:data:`PRESETS`). :func:`read_hf_config` returns its parsed content with the
architecture's family (:class:`Family`); :func:`apply_hf_config` runs at config composition: it
resolves the path to an absolute one (ranks run elsewhere) and copies the architecture's sizes into
``model.n_layer``, ``model.d_model``, ``model.n_head`` and ``model.vocab``, so that pipeline layout,
activation shapes and state sizes follow the Hugging Face config. Nothing here imports transformers.

Failure behaviour: an unreadable or malformed file, an architecture outside :data:`FAMILIES`, dropout
above 0, tied input and output embeddings, a ``model.seq_len`` beyond the model's positions, or an
HF config without ``train.task`` naming an HF Task raise :class:`~tmslurm.core.errors.ConfigError`
naming the override (or the config field) to change. Nothing is changed when an error is raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tmslurm.core.errors import ConfigError

HF_TASK = "tmslurm.train.hf:CausalLMTask"


@dataclass(frozen=True, kw_only=True)
class Family:
    """Where one architecture keeps its parts (attribute names of its base model) and its size fields."""

    embed: str
    """The token embedding (first stage only)."""
    positions: str | None
    """A learned position table added inside the base model (GPT-2's ``wpe``); None for RoPE models."""
    norm: str
    """The final norm (last stage only)."""
    tied_default: bool
    """``tie_word_embeddings`` when the config does not say."""
    scaled: tuple[str, ...] = ()
    """Parameter name suffixes initialised with std / sqrt(2 n_layer) (GPT-2's residual projections)."""
    layers: str = "num_hidden_layers"
    width: str = "hidden_size"
    heads: str = "num_attention_heads"
    max_positions: str = "max_position_embeddings"


_ROPE = Family(embed="embed_tokens", positions=None, norm="norm", tied_default=False)
FAMILIES = {
    "llama": _ROPE,
    "mistral": _ROPE,
    "qwen2": _ROPE,
    "gpt2": Family(
        embed="wte",
        positions="wpe",
        norm="ln_f",
        tied_default=True,
        scaled=("c_proj.weight",),
        layers="n_layer",
        width="n_embd",
        heads="n_head",
        max_positions="n_positions",
    ),
}
"""The model_types CausalLMTask splits into stages (Llama-architecture models and GPT-2)."""

DROPOUT_FIELDS = (
    "attention_dropout",
    "hidden_dropout",
    "mlp_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
    "dropout",
)

PRESETS: dict[str, dict[str, Any]] = {
    "llama-tiny": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
    },
    "gpt2-tiny": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": 256,
        "n_embd": 64,
        "n_layer": 4,
        "n_head": 4,
        "n_positions": 128,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": False,
    },
}
"""Named configs for ``model.hf_config=<name>`` (the same as examples/hf/<name>/config.json)."""


@dataclass(frozen=True, kw_only=True)
class HFModel:
    """A parsed Hugging Face config: its fields, its family and the sizes tmslurm lays out by."""

    fields: dict[str, Any]
    family: Family
    n_layer: int
    width: int
    heads: int
    vocab: int
    max_positions: int

    @property
    def model_type(self) -> str:
        return str(self.fields["model_type"])


def _load(source: str) -> dict[str, Any]:
    if source in PRESETS:
        return dict(PRESETS[source])
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"model.hf_config={source!r} cannot be read as a Hugging Face config.json ({exc}). Fix: "
            f"point model.hf_config at a config.json or name a preset: {', '.join(PRESETS)}."
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"model.hf_config={source!r} is not a JSON object. Fix: point it at a Hugging Face config.json."
        )
    return data


def _int_field(data: dict[str, Any], key: str, source: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"model.hf_config={source!r}: field {key!r} is {value!r}, not a positive integer. "
            f"Fix: set {key} in the config file."
        )
    return value


def read_hf_config(source: str) -> HFModel:
    """Parse and check one config (a path or a preset name); ConfigError on anything CausalLMTask refuses."""
    data = _load(source)
    model_type = data.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(
            f"model.hf_config={source!r} has model_type={model_type!r}; CausalLMTask splits "
            f"{', '.join(FAMILIES)}. Fix: use a config of one of those architectures."
        )
    family = FAMILIES[model_type]
    for key in DROPOUT_FIELDS:
        value = data.get(key, 0.0)
        if isinstance(value, (int, float)) and value > 0:
            raise ConfigError(
                f"model.hf_config={source!r} sets {key}={value}: dropout draws random masks, so a "
                f"replacement rank could not repeat a step exactly. Fix: set {key} to 0.0 in the config file."
            )
    if data.get("tie_word_embeddings", family.tied_default):
        raise ConfigError(
            f"model.hf_config={source!r} ties the input and output embeddings (tie_word_embeddings, "
            f"default {family.tied_default} for {model_type}); they live on different pipeline stages and "
            'tmslurm does not keep them tied. Fix: set "tie_word_embeddings": false in the config file.'
        )
    return HFModel(
        fields=data,
        family=family,
        n_layer=_int_field(data, family.layers, source),
        width=_int_field(data, family.width, source),
        heads=_int_field(data, family.heads, source),
        vocab=_int_field(data, "vocab_size", source),
        max_positions=_int_field(data, family.max_positions, source),
    )


def apply_hf_config(cfg: Any) -> None:
    """At composition: resolve ``model.hf_config`` and copy its sizes into ``model`` (no-op when unset)."""
    m = cfg.model
    if m.hf_config is None:
        if m.hf_tokenizer is not None:
            raise ConfigError(
                "model.hf_tokenizer is set without model.hf_config. Fix: pass model.hf_config=<config.json>."
            )
        return
    hf = read_hf_config(m.hf_config)
    if cfg.train.task == "tmslurm.train.model:ReferenceTask":
        raise ConfigError(
            f"model.hf_config is set but train.task={cfg.train.task!r} is the reference model. "
            f"Fix: add train.task={HF_TASK}."
        )
    if m.seq_len > hf.max_positions:
        raise ConfigError(
            f"model.seq_len={m.seq_len} exceeds the model's {hf.family.max_positions}={hf.max_positions}. "
            f"Fix: pass model.seq_len<={hf.max_positions}."
        )
    if m.hf_tokenizer is not None:
        path = Path(m.hf_tokenizer)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(
                f"model.hf_tokenizer={m.hf_tokenizer!r} holds no tokenizer.json. Fix: point it at a "
                "tokenizer.json (or its folder), or leave it unset for byte-level tokens."
            )
        m.hf_tokenizer = str(path.resolve())
    if m.hf_config not in PRESETS:
        path = Path(m.hf_config)
        m.hf_config = str((path / "config.json" if path.is_dir() else path).resolve())
    m.n_layer, m.d_model, m.n_head, m.vocab = hf.n_layer, hf.width, hf.heads, hf.vocab
    m.size = "hf"
