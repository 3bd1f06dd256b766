"""Checkpoints of one pipeline stage with torch.distributed.checkpoint (DCP).

Contract: :func:`save_stage` writes ``<run_dir>/checkpoints/step_<k>/<shard>/`` (``stage<j>``, or
``stage<j>-tp<t>`` with tensor parallelism; DCP files plus
``meta.json`` with the step, the data position and the parameter digest), written by the stage's
data-parallel rank 0 only, without any process group (``no_dist=True``). A checkpoint is *complete*
when every shard has its ``meta.json``; :func:`latest_complete` finds the newest complete one.
:func:`load_stage` restores model and optimizer in place and checks the parameter digest; a missing
directory, an unreadable/corrupt DCP file or a digest mismatch raises
:class:`~tmslurm.core.errors.CheckpointError` naming the file. Saving never touches the live tensors:
:func:`snapshot` copies them to CPU at the step boundary, and :func:`write_meta` (which computes both
digests from that copy) is called only once the DCP files are written, so a shard without
``meta.json`` is never taken for complete. The asynchronous variant is
:mod:`tmslurm.train.async_checkpoint`.

At ``parallel.zero=1`` (:mod:`tmslurm.train.zero`) every data-parallel rank saves its own optimizer
slice to ``<shard>/slice<d>of<dp>/`` (:func:`shard_of`), and :func:`load_slices` loads a rank's slice
and its buddy's, resharding when the run's dp differs from the saved one. A checkpoint of the other
zero level raises CheckpointError naming ``parallel.zero``; an incomplete set of slices, or slices of
another model, raise CheckpointError too.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tmslurm.core.errors import CheckpointError
from tmslurm.core.jsonfile import write_json_atomic
from tmslurm.core.rundir import RunDir
from tmslurm.core.topology import Layout
from tmslurm.train.ckpt_index import latest_complete  # noqa: F401  (re-exported)
from tmslurm.train.schedule import StageRunner, named_digest
from tmslurm.train.zero import ZeroStageRunner

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return RunDir(Path(run_dir)).checkpoint(step)


def shard_of(layout: Layout, rank: int) -> str:
    """Where ``rank`` saves: its shard (``stage<j>[-tp<t>]``), or at ``parallel.zero=1`` its optimizer
    slice inside the shard (``stage<j>/slice<d>of<dp>``, every data-parallel rank saves one)."""
    name = layout.shard_name(rank)
    return f"{name}/slice{layout.coord(rank).dp}of{layout.dp}" if layout.zero else name


def _flat_state(runner: StageRunner) -> dict[str, torch.Tensor]:
    """Model and AdamW state as a flat dict of tensors (DCP loads in place into a same-shaped dict);
    a sharded runner's own slice (:meth:`ZeroStageRunner.checkpoint_tensors`)."""
    if isinstance(runner, ZeroStageRunner):
        return runner.checkpoint_tensors()
    out = {f"model/{k}": v for k, v in runner.module.state_dict().items()}
    opt = runner.optimizer.state_dict()["state"]
    for i, p in enumerate(runner.params):
        st = opt.get(i, {})
        for key in _optim_keys(runner):
            if key == "step":
                out[f"optim/{i}/step"] = torch.as_tensor(
                    st.get("step", torch.tensor(0.0)), dtype=torch.float32
                ).reshape(())
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
    model = {k[len("model/") :]: v for k, v in snap.state.items() if k.startswith("model/")}
    meta = {
        "step": snap.step,
        "stage": snap.stage,
        "data_step": snap.step,
        "digest": named_digest(model),
        "state_digest": state_digest(snap.state),
        "has_optim_state": snap.has_optim_state,
    }
    write_json_atomic(path / "meta.json", meta)


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
    if isinstance(runner, ZeroStageRunner):
        load_slices(path, runner)
        log.info("checkpoint step=%d %s (dp rank %d's slice) loaded from %s", step, stage, runner.dp_rank, path)
        return
    if not (path / "meta.json").exists() and any(path.glob("slice*of*")):
        raise CheckpointError(
            f"checkpoint {path} holds optimizer slices of a parallel.zero=1 run; this run has "
            f"parallel.zero=0. Fix: pass parallel.zero=1 to resume it."
        )
    state, meta = load_dir(path, {k: torch.empty_like(v) for k, v in _flat_state(runner).items()})
    _restore(runner, state, bool(meta.get("has_optim_state", True)))
    log.info("checkpoint step=%d stage=%s loaded from %s", step, stage, path)


def load_dir(path: Path, template: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load one saved directory into ``template`` (same keys and shapes) and check its digest."""
    meta_file = path / "meta.json"
    try:
        meta = json.loads(meta_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {meta_file} is missing (no complete checkpoint at that step)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {meta_file} is corrupt: {exc}") from None
    try:
        dcp.load(template, checkpoint_id=str(path), no_dist=True)
    except (Exception, CheckpointException) as exc:  # CheckpointException derives from BaseException
        files = ", ".join(sorted(p.name for p in path.iterdir()))
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded ({files}): {type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    if state_digest(template) != meta.get("state_digest"):
        raise CheckpointError(
            f"checkpoint {path}: the loaded tensors do not match the digest in {meta_file} (corrupt data file)"
        )
    return template, meta


def _restore(runner: StageRunner, state: dict[str, torch.Tensor], has_optim: bool) -> None:
    runner.module.load_state_dict({k[len("model/") :]: v for k, v in state.items() if k.startswith("model/")})
    if not has_optim:
        return
    sd: dict[str, Any] = runner.optimizer.state_dict()
    sd["state"] = {
        i: {k: state[f"optim/{i}/{k}"].clone() for k in _optim_keys(runner)} for i in range(len(runner.params))
    }
    runner.optimizer.load_state_dict(sd)


# ---- sharded optimizer (parallel.zero=1) -------------------------------------------------------
def load_slices(path: Path, runner: ZeroStageRunner) -> None:
    """Load a rank's own slice and its buddy's (the ward) from a shard saved as ``slice<d>of<D>``.

    With D equal to the run's dp only the two slices are read. With another D (the run resumes at
    another data-parallel size) every saved slice is read, the flat parameters and moments are joined
    and cut again at the new slice size: resharding is exact, since slices are plain ranges of one
    flat buffer. Refuses a zero=0 shard and a set of slices that is incomplete or of another model.
    """
    saved = _saved_slices(path)
    total = next(iter(saved.values()))[1]
    if sorted(saved) != list(range(total)):
        raise CheckpointError(f"checkpoint {path} has slices {sorted(saved)} of {total}: incomplete")
    old_chunk = -(-runner.numel // total)
    if total == runner.dp:
        own = load_dir(saved[runner.dp_rank][0], _template(saved[runner.dp_rank][0], old_chunk))[0]
        ward = load_dir(saved[runner.buddy_dp][0], _template(saved[runner.buddy_dp][0], old_chunk))[0]
    else:
        parts = [load_dir(saved[d][0], _template(saved[d][0], old_chunk))[0] for d in range(total)]
        own, ward = (_recut(parts, runner, d) for d in (runner.dp_rank, runner.buddy_dp))
    runner.load_state(
        {
            "own": {"param": own["slice/param"], "optim": _optim_sd(runner, own)},
            "ward": {"optim": _optim_sd(runner, ward)},
        }
    )


def _template(path: Path, chunk: int) -> dict[str, torch.Tensor]:
    """Empty tensors for every key the slice saved (read from DCP's metadata), checked against the
    slice size this model gives: a slice of another model is refused."""
    try:
        meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except (Exception, CheckpointException) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {type(exc).__name__}: {str(exc)[:300]}") from None
    out = {}
    for key, md in meta.items():
        if not isinstance(md, TensorStorageMetadata) or (len(md.size) and tuple(md.size) != (chunk,)):
            raise CheckpointError(
                f"checkpoint {path}: {key} has shape {getattr(md, 'size', None)}, a slice of this model has ({chunk},) "
                f"(saved from another model?)"
            )
        out[key] = torch.empty(md.size, dtype=md.properties.dtype)
    return out


def _saved_slices(path: Path) -> dict[int, tuple[Path, int]]:
    if (path / "meta.json").exists():
        raise CheckpointError(
            f"checkpoint {path} was written at parallel.zero=0 (whole optimizer per rank); this run "
            f"has parallel.zero=1. Fix: pass parallel.zero=0 to resume it."
        )
    saved: dict[int, tuple[Path, int]] = {}
    for d in sorted(path.glob("slice*of*")):
        index, _, total = d.name.removeprefix("slice").partition("of")
        if index.isdigit() and total.isdigit():
            saved[int(index)] = (d, int(total))
    if not saved:
        raise CheckpointError(f"checkpoint {path} is missing (no slice directories)")
    if len({t for _, t in saved.values()}) > 1:
        raise CheckpointError(
            f"checkpoint {path} mixes slices of several data-parallel sizes: "
            f"{sorted(p.name for p, _ in saved.values())}"
        )
    return saved


def _recut(parts: list[dict[str, torch.Tensor]], runner: ZeroStageRunner, dp_rank: int) -> dict[str, torch.Tensor]:
    """Slice ``dp_rank`` of the new layout from the old layout's slices (joined, trimmed, padded)."""
    out = {}
    for key, first in parts[0].items():
        if first.dim() == 0:
            out[key] = first
            continue
        whole = torch.cat([p[key] for p in parts])[: runner.numel]
        padded = torch.zeros(runner.chunk * runner.dp, dtype=whole.dtype)
        padded[: runner.numel] = whole
        out[key] = padded[dp_rank * runner.chunk : (dp_rank + 1) * runner.chunk].clone()
    return out


def _optim_sd(runner: ZeroStageRunner, flat: dict[str, torch.Tensor]) -> dict[str, Any]:
    groups = runner.optimizer.state_dict()["param_groups"]
    state = {k.removeprefix("slice/optim/"): v for k, v in flat.items() if k.startswith("slice/optim/")}
    return {"state": {0: state}, "param_groups": groups}
