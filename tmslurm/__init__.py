"""tmslurm: keep distributed PyTorch training alive through node loss and maintenance on Slurm.

The public API (:mod:`tmslurm.api`), listed in ``__all__``: :func:`compose` a config from Hydra
overrides, :func:`launch` a run and follow its :class:`Run` (``status()``, ``wait()`` returning the typed
:class:`Summary`), :func:`notify` the runs on a node of an admin notice, and the :class:`Task`
protocol with its :class:`StageSpec` that a user's model implements.

Importing the package is cheap and side-effect free: no logging configuration, no torch import; each
name is imported from its module when first used (``Task`` and ``StageSpec`` import torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_HOMES = {
    "compose": "tmslurm.api",
    "launch": "tmslurm.api",
    "notify": "tmslurm.api",
    "Run": "tmslurm.api",
    "WaitTimeout": "tmslurm.api",
    "RunConfig": "tmslurm.core.config",
    "Summary": "tmslurm.core.results",
    "Event": "tmslurm.core.results",
    "TmslurmError": "tmslurm.core.errors",
    "ConfigError": "tmslurm.core.errors",
    "Task": "tmslurm.train.task",
    "StageSpec": "tmslurm.train.task",
}
"""Each public name and the module it is defined in."""

__all__ = [
    "__version__",
    "compose",
    "launch",
    "notify",
    "Run",
    "WaitTimeout",
    "RunConfig",
    "Summary",
    "Event",
    "TmslurmError",
    "ConfigError",
    "Task",
    "StageSpec",
]
"""The API: every name but ``__version__`` is one of :data:`_HOMES`."""

if TYPE_CHECKING:
    from tmslurm.api import Run, WaitTimeout, compose, launch, notify
    from tmslurm.core.config import RunConfig
    from tmslurm.core.errors import ConfigError, TmslurmError
    from tmslurm.core.results import Event, Summary
    from tmslurm.train.task import StageSpec, Task


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tmslurm' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
