"""A run's configuration as plain data: what run_dir/config.json holds and what ranks receive.

Contract: :func:`to_dict` and :func:`from_dict` are inverse (``from_dict(to_dict(cfg)) == cfg``);
:func:`to_dataclass` turns a composed OmegaConf node into a :class:`~.schema.RunConfig`. Failure
behaviour: an unknown top-level key raises :class:`~tmslurm.core.errors.ConfigError` naming the valid
keys; an unknown field inside a section raises the dataclass's TypeError. Nothing here validates
(see :mod:`.validation`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tmslurm.core.config.faults import FaultConfig
from tmslurm.core.config.schema import RunConfig
from tmslurm.core.errors import ConfigError


def to_dataclass(node: Any) -> RunConfig:
    """Convert a composed OmegaConf node into a plain RunConfig (lists of dicts become FaultConfig)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    if not isinstance(data, dict):
        raise ConfigError(f"the composed config is a {type(data).__name__}, not a mapping of sections")
    return from_dict({str(k): v for k, v in data.items()})


def from_dict(data: dict) -> RunConfig:
    """Build a RunConfig from a plain dict (as written to run_dir/config.json)."""
    data = dict(data)
    data.pop("defaults", None)
    sub = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    kwargs: dict[str, Any] = {}
    classes = {
        f.name: f.default_factory for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(f.default_factory)
    }
    for key, value in data.items():
        if key not in sub:
            raise ConfigError(
                f"unknown config key {key!r}; valid keys: {', '.join(k for k in sub if k != 'defaults')}."
            )
        if key in classes:
            kwargs[key] = classes[key](**value)  # type: ignore[operator]
        elif key == "faults":
            kwargs[key] = [FaultConfig(**f) for f in value]
        else:
            kwargs[key] = value
    return RunConfig(**kwargs)


def to_dict(cfg: RunConfig) -> dict:
    data = dataclasses.asdict(cfg)
    data.pop("defaults", None)
    return data
