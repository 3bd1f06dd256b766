"""CausalLMTask: Hugging Face models split into stages exactly, and every refusal names its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tmslurm.core.config import ModelConfig, TrainConfig, compose_config
from tmslurm.core.errors import ConfigError
from tmslurm.core.hfconfig import PRESETS
from tmslurm.core.topology import split_layers
from tmslurm.train.task import StageSpec

transformers = pytest.importorskip("transformers")
from tmslurm.train.hf import CausalLMTask  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"
HF = ("train.task=tmslurm.train.hf:CausalLMTask",)


def _task(preset: str = "llama-tiny", **train) -> CausalLMTask:
    cfg = compose_config([*HF, f"model.hf_config={preset}"])
    return CausalLMTask(cfg.model, TrainConfig(**train))


def _roles(pp: int) -> list[str]:
    return ["only"] if pp == 1 else ["first", *["middle"] * (pp - 2), "last"]


def _pipeline(task: CausalLMTask, pp: int, x: torch.Tensor) -> torch.Tensor:
    for stage, (role, blocks) in enumerate(zip(_roles(pp), split_layers(4, pp))):
        x = task.build_stage(StageSpec(stage, pp, role, blocks), torch.device("cpu"))(x)
    return x


@pytest.mark.parametrize("preset", list(PRESETS))
def test_logits_do_not_depend_on_the_split_and_equal_the_hf_model(preset):
    task = _task(preset)
    x, y = task.batch(3, 1)
    logits = [_pipeline(task, pp, x) for pp in (1, 2, 4)]
    assert all(torch.equal(logits[0], other) for other in logits[1:])
    # transformers' own *ForCausalLM with the same weights computes the same logits
    only = task.build_stage(StageSpec(0, 1, "only", range(4)), torch.device("cpu"))
    config = transformers.AutoConfig.for_model(**PRESETS[preset])
    full = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    prefix = full.base_model_prefix
    state = {
        k.replace("body.", f"{prefix}.", 1).replace("head.", "lm_head.", 1): v for k, v in only.state_dict().items()
    }
    full.load_state_dict(state, strict=True)
    assert torch.equal(full(input_ids=x, use_cache=False).logits, logits[0])
    assert 5.0 < task.loss(logits[0], y).item() < 6.0  # ~ln(256) at initialisation


def test_the_example_configs_are_the_presets():
    for name, fields in PRESETS.items():
        assert json.loads((EXAMPLES / name / "config.json").read_text()) == fields


def test_composition_takes_the_sizes_from_the_hf_config_and_resolves_its_path(monkeypatch):
    monkeypatch.chdir(EXAMPLES)
    cfg = compose_config([*HF, "model.hf_config=gpt2-tiny/config.json", "parallel.pp=2"])
    m = cfg.model
    assert (m.n_layer, m.d_model, m.n_head, m.vocab, m.size) == (4, 64, 4, 256, "hf")
    assert Path(m.hf_config).is_absolute() and Path(m.hf_config) == EXAMPLES / "gpt2-tiny" / "config.json"
    folder = compose_config([*HF, "model.hf_config=./llama-tiny"])  # a folder holding config.json works too
    assert folder.model.d_model == 64


def _write(tmp_path: Path, **changes) -> str:
    fields = {**PRESETS["llama-tiny"], **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in fields.items() if v is not None}))
    return str(path)


@pytest.mark.parametrize(
    "changes,overrides,named",
    [
        ({"attention_dropout": 0.1}, (), "attention_dropout"),
        ({"tie_word_embeddings": True}, (), "tie_word_embeddings"),
        ({"model_type": "bert"}, (), "model_type='bert'"),
        ({"hidden_size": "64"}, (), "hidden_size"),
        ({"max_position_embeddings": 16}, (), "model.seq_len<=16"),
        ({}, ("train.task=tmslurm.train.model:ReferenceTask",), "train.task=tmslurm.train.hf:CausalLMTask"),
        ({}, ("parallel.tp=2",), "parallel.tp"),
        ({}, ("model.hf_tokenizer=nowhere",), "model.hf_tokenizer"),
    ],
)
def test_refusals_name_the_fix(tmp_path, changes, overrides, named):
    with pytest.raises(ConfigError) as err:
        compose_config([*HF, f"model.hf_config={_write(tmp_path, **changes)}", *overrides])
    assert named in str(err.value)


def test_gpt2_ties_its_embeddings_unless_told_not_to(tmp_path):
    fields = dict(PRESETS["gpt2-tiny"])
    del fields["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        compose_config([*HF, f"model.hf_config={tmp_path}"])


@pytest.mark.parametrize("value", ["missing.json", "{not json"])
def test_unreadable_configs_and_a_tokenizer_without_a_model(tmp_path, value):
    path = tmp_path / "c.json"
    if value.startswith("{"):
        path.write_text(value)
    with pytest.raises(ConfigError, match="model.hf_config=.*Fix"):
        compose_config([*HF, f"model.hf_config={path}"])
    with pytest.raises(ConfigError, match="model.hf_tokenizer is set without model.hf_config"):
        compose_config([*HF, f"model.hf_tokenizer={tmp_path}"])


def _tokenizer(tmp_path: Path, first_id: int) -> Path:
    """A word-level tokenizer.json whose ids start at ``first_id``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "."]
    tok = Tokenizer(models.WordLevel({w: first_id + i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / f"tok{first_id}" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


def test_a_local_tokenizer_feeds_its_ids_and_one_too_large_is_refused(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    small = _tokenizer(tmp_path, 100)
    cfg = compose_config(
        [*HF, "model.hf_config=llama-tiny", f"model.hf_tokenizer={small.parent}", f"train.data_path={text}"]
    )
    assert cfg.model.hf_tokenizer == str(small)
    task = CausalLMTask(cfg.model, cfg.train)
    x, y = task.batch(0, 0)
    assert 101 <= int(x.min()) and int(x.max()) <= 109 and torch.equal(x[:, 1:], y[:, :-1])
    assert task.batch(0, 0)[0].equal(x) and not task.batch(1, 0)[0].equal(x)
    big = _tokenizer(tmp_path, 250)
    cfg = compose_config([*HF, "model.hf_config=llama-tiny", f"model.hf_tokenizer={big}", f"train.data_path={text}"])
    with pytest.raises(ConfigError, match="vocab_size=256"):
        CausalLMTask(cfg.model, cfg.train)


def test_the_task_alone_needs_a_model():
    with pytest.raises(ConfigError, match="model.hf_config="):
        CausalLMTask(ModelConfig(), TrainConfig())
