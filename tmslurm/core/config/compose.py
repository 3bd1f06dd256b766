"""Composition of a run's configuration from Hydra overrides: the part of the config that touches the outside.

Contract: :func:`compose_config` checks the overrides' keys (:mod:`.overrides`), composes the schema
(:mod:`.schema`) with the presets shipped in ``tmslurm/conf/`` (:mod:`.presets`) and the overrides,
applies the cluster's defaults and a Hugging Face config (:mod:`tmslurm.core.hfconfig`), checks the
cross-field rules (:mod:`.validation`) and then what only the outside can tell
(:func:`check_environment`): that ``train.task`` imports, that ``train.resume_from`` and
``train.data_path`` exist, that prometheus-client is there when metrics are asked for. The site's
defaults (:mod:`.site`: the admin public key) fill what the run left unset.
Failure behaviour: every failure, Hydra's included, is one :class:`~tmslurm.core.errors.ConfigError`
naming the override to change.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from pathlib import Path

from tmslurm.core.config.dicts import to_dataclass
from tmslurm.core.config.faults import FaultConfig
from tmslurm.core.config.overrides import check_overrides, closest
from tmslurm.core.config.presets import CONF_DIR
from tmslurm.core.config.schema import SLURM_CHECKPOINT_EVERY, RunConfig, register_configs
from tmslurm.core.config.site import apply_site_defaults
from tmslurm.core.config.validation import validate
from tmslurm.core.errors import ConfigError
from tmslurm.core.hfconfig import apply_hf_config
from tmslurm.core.imports import import_class

FAULT_FIELDS = tuple(f.name for f in dataclasses.fields(FaultConfig))
_FAULT_FIELD = re.compile(r"Key '(\w+)' not in 'FaultConfig'")


def compose_config(overrides: list[str]) -> RunConfig:
    """Compose the config from Hydra overrides and validate it; every failure is a ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = check_overrides(list(overrides))
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            node = compose(config_name="tmslurm", overrides=list(overrides))
    except Exception as exc:  # Hydra raises several unrelated types for bad overrides
        raise ConfigError(_hydra_message(exc, overrides)) from None
    try:
        cfg = to_dataclass(node)
    except Exception as exc:  # OmegaConf's MissingMandatoryValue, TypeError from a dataclass
        raise ConfigError(_conversion_message(exc, overrides)) from None
    apply_cluster_defaults(cfg, overrides)
    apply_site_defaults(cfg)
    apply_hf_config(cfg)
    validate(cfg)
    check_environment(cfg)
    return cfg


def apply_cluster_defaults(cfg: RunConfig, overrides: list[str]) -> None:
    """cluster=slurm: periodic checkpoints every SLURM_CHECKPOINT_EVERY steps unless train.checkpoint_every
    is given on the command line (a preset's value other than 0 is kept too)."""
    given = any(o.lstrip("+~").split("=", 1)[0] == "train.checkpoint_every" for o in overrides)
    if cfg.cluster == "slurm" and cfg.train.checkpoint_every == 0 and not given:
        cfg.train.checkpoint_every = SLURM_CHECKPOINT_EVERY


def _conversion_message(exc: Exception, overrides: list[str]) -> str:
    """A composed node that does not fit the dataclasses: only fault entries get this far (every other
    key was checked by check_overrides and typed by Hydra), so the hint is about them."""
    text = f"invalid override ({' '.join(overrides)}): {str(exc).splitlines()[0]}"
    if any(o.lstrip("+~").startswith("faults") for o in overrides):
        return (
            f"{text}. Fix: each fault needs step and kind (fields: {', '.join(FAULT_FIELDS)}), "
            "e.g. faults='[{step:10,kind:drain,rank:1}]'"
        )
    return text


def _hydra_message(exc: Exception, overrides: list[str]) -> str:
    text = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text = f"{text}\n{str(cause).strip()}"
    field = _FAULT_FIELD.search(text)
    if field:
        close = closest(field.group(1), list(FAULT_FIELDS))
        hint = f"did you mean faults[i].{close}?" if close else f"the fields are {', '.join(FAULT_FIELDS)}"
        return f"unknown key faults[i].{field.group(1)}; {hint}"
    noise = ("full_key", "reference_type", "object_type", "Config search path", "provider=", "To append to your")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(noise)]
    body = "; ".join(ln.strip() for ln in lines[:8])
    return f"invalid override ({' '.join(overrides) or 'none'}): {body}"


def _check_task(spec: str) -> None:
    import_class(spec, "train.task")


def _check_task_tp(spec: str, tp: int) -> None:
    if not getattr(import_class(spec, "train.task"), "supports_tp", False):
        raise ConfigError(
            f"train.task={spec!r} does not support tensor parallelism (no supports_tp = True); "
            f"parallel.tp={tp}. Fix: pass parallel.tp=1 or make the Task tensor-parallel."
        )


def check_environment(cfg: RunConfig) -> None:
    """What the cross-field rules cannot tell: the Task imports (and is tensor-parallel when asked to
    be), the files named exist, the metrics library is installed when metrics are served."""
    t = cfg.train
    _check_task(t.task)
    if cfg.parallel.tp > 1:
        _check_task_tp(t.task, cfg.parallel.tp)
    if t.resume_from is not None and not Path(t.resume_from, "checkpoints").is_dir():
        raise ConfigError(
            f"train.resume_from={t.resume_from!r} holds no checkpoints/ directory. "
            "Fix: point it at a run directory that saved checkpoints (train.checkpoint_every>0)."
        )
    if t.data_path is not None and not Path(t.data_path).is_file():
        raise ConfigError(
            f"train.data_path={t.data_path!r} is not a readable file. "
            "Fix: point train.data_path at a text file or leave it unset."
        )
    for name in ("port", "monitor_port"):
        if getattr(cfg.metrics, name) and importlib.util.find_spec("prometheus_client") is None:
            raise ConfigError(
                f"metrics.{name} needs prometheus-client. Fix: pip install 'tmslurm[metrics]', "
                f"or pass metrics.{name}=0."
            )
