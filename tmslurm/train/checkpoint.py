"""Checkpoints of one pipeline stage with torch.distributed.checkpoint (DCP).

Contract: :func:`save_stage` writes ``<run_dir>/checkpoints/step_<k>/<shard>/`` (``stage<j>``, or
``stage<j>-tp<t>`` with tensor parallelism; DCP files plus
``meta.json`` with the step, the data position and the parameter digest), written by the stage's
data-parallel rank 0 only, without any process group (``no_dist=True``). A checkpoint is *complete*
when every shard has its ``meta.json``; :func:`latest_complete` finds the newest complete one.
:func:`load_stage` restores model and optimizer in place and checks the parameter digest; a missing
directory, an unreadable/corrupt DCP file or a digest mismatch raises
:class:`~tmslurm.errors.CheckpointError` naming the file. Saving never touches the live tensors:
:func:`snapshot` copies them to CPU at the step boundary, and :func:`write_meta` (which computes both
digests from that copy) is called only once the DCP files are written, so a shard without
``meta.json`` is never taken for complete. The asynchronous variant is
:mod:`tmslurm.train.async_checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from tmslurm.errors import CheckpointError
from tmslurm.rundir import RunDir
from tmslurm.train.ckpt_index import latest_complete  # noqa: F401  (re-exported)
from tmslurm.train.schedule import StageRunner, named_digest

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return RunDir(Path(run_dir)).checkpoint(step)


def _flat_state(runner: StageRunner) -> dict[str, torch.Tensor]:
    """Model and AdamW state as a flat dict of tensors (DCP loads in place into a same-shaped dict)."""
    out = {f"model/{k}": v for k, v in runner.module.state_dict().items()}
    opt = runner.optimizer.state_dict()["state"]
    for i, p in enumerate(runner.params):
        st = opt.get(i, {})
        for key in _optim_keys(runner):
            if key == "step":
                out[f"optim/{i}/step"] = torch.as_tensor(st.get("step", torch.tensor(0.0)), dtype=torch.float32).reshape(())
            else:
                out[f"optim/{i}/{key}"] = st.get(key, torch.zeros_like(p))
    return out


def _optim_keys(runner: StageRunner) -> tuple[str, ...]:
    """Per-parameter optimizer state kept in checkpoints (AdamW moments or SGD momentum)."""
    if isinstance(runner.optimizer, torch.optim.SGD):
        return ("momentum_buffer",)
    return ("step", "exp_avg", "exp_avg_sq")


def _shard_dir(stage: int | str) -> str:
    return stage if isinstance(stage, str) else f"stage{stage}"


@dataclass(frozen=True)
class Snapshot:
    """A stage's state after ``step`` committed steps, as private CPU copies (never the live tensors)."""

    step: int
    stage: int | str
    state: dict[str, torch.Tensor]
    has_optim_state: bool

    @property
    def shard(self) -> str:
        return _shard_dir(self.stage)


def snapshot(runner: StageRunner, step: int, stage: int | str) -> Snapshot:
    """Copy the stage's model and optimizer state to CPU now (the step boundary); training may go on."""
    state = {k: v.detach().to("cpu", copy=True) for k, v in _flat_state(runner).items()}
    return Snapshot(step, stage, state, bool(runner.optimizer.state_dict()["state"]))


def shard_path(run_dir: str | Path, snap: Snapshot) -> Path:
    """The shard's directory, created if needed; a ``meta.json`` left there by an earlier save of the
    same step is removed first, so the shard is not complete while its files are being rewritten."""
    path = checkpoint_dir(run_dir, snap.step) / snap.shard
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").unlink(missing_ok=True)
    return path


def write_meta(path: Path, snap: Snapshot) -> None:
    """Mark the shard complete: call only after its DCP files are fully written (atomic replace)."""
    model = {k[len("model/"):]: v for k, v in snap.state.items() if k.startswith("model/")}
    meta = {"step": snap.step, "stage": snap.stage, "data_step": snap.step, "digest": named_digest(model),
            "state_digest": state_digest(snap.state), "has_optim_state": snap.has_optim_state}
    tmp = path / "meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, path / "meta.json")


def save_stage(run_dir: str | Path, step: int, stage: int | str, runner: StageRunner) -> Path:
    """Save a stage (its index, or a shard name such as ``stage1-tp0``) after ``step`` committed steps."""
    snap = snapshot(runner, step, stage)
    path = shard_path(run_dir, snap)
    dcp.save(snap.state, checkpoint_id=str(path), no_dist=True)
    write_meta(path, snap)
    log.info("checkpoint step=%d %s saved to %s", step, snap.shard, path)
    return path


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor of a flat state dict, in key order."""
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def load_stage(run_dir: str | Path, step: int, stage: int | str, runner: StageRunner) -> None:
    path = checkpoint_dir(run_dir, step) / _shard_dir(stage)
    meta_file = path / "meta.json"
    try:
        meta = json.loads(meta_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {meta_file} is missing (no complete checkpoint at step {step})") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {meta_file} is corrupt: {exc}") from None
    state = {k: torch.empty_like(v) for k, v in _flat_state(runner).items()}
    try:
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    except (Exception, CheckpointException) as exc:  # CheckpointException derives from BaseException
        files = ", ".join(sorted(p.name for p in path.iterdir()))
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({files}): {type(exc).__name__}: {str(exc)[:300]}") from None
    if state_digest(state) != meta.get("state_digest"):
        raise CheckpointError(f"checkpoint {path}: the loaded tensors do not match the digest in {meta_file} (corrupt data file)")
    _restore(runner, state, bool(meta.get("has_optim_state", True)))
    log.info("checkpoint step=%d stage=%s loaded from %s", step, stage, path)


def _restore(runner: StageRunner, state: dict[str, torch.Tensor], has_optim: bool) -> None:
    runner.module.load_state_dict({k[len("model/"):]: v for k, v in state.items() if k.startswith("model/")})
    if not has_optim:
        return
    sd: dict[str, Any] = runner.optimizer.state_dict()
    sd["state"] = {i: {k: state[f"optim/{i}/{k}"].clone() for k in _optim_keys(runner)} for i in range(len(runner.params))}
    runner.optimizer.load_state_dict(sd)
