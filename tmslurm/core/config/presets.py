"""The presets shipped with tmslurm: the Hydra config groups under ``tmslurm/conf/`` (package data).

Contract: :data:`CONF_DIR` is the folder Hydra composes from, with one sub-folder per config group:
``cluster`` (local, slurm), ``model`` (tiny, small, medium, base, large) and ``experiment`` (demo, used
as ``+experiment=demo``). :func:`group_options` lists a group's presets; :data:`MODEL_PRESETS` holds the
model presets as :class:`~.schema.ModelConfig`, read from ``conf/model/*.yaml`` with PyYAML when this
module is imported (the files ship inside the package, so an installed wheel has them). Failure
behaviour: a missing or malformed preset file raises at import (a broken installation, not a user error).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tmslurm.core.config.schema import ModelConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("cluster", "model", "experiment")
"""The config groups, in the order ``tmslurm-launch --help`` lists them."""
APPENDED_GROUPS = ("experiment",)
"""Groups with no default: chosen with ``+group=name``."""
MODEL_ORDER = ("tiny", "small", "medium", "base", "large")


def group_options(group: str) -> list[str]:
    """The presets of one config group (file names without .yaml), smallest model first for ``model``."""
    names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    order = {n: i for i, n in enumerate(MODEL_ORDER)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def group_doc(group: str, name: str) -> str:
    """The first comment line of a preset file after the @package line, without its ``group=name:`` lead."""
    for line in (CONF_DIR / group / f"{name}.yaml").read_text().splitlines():
        if line.startswith("#") and "@package" not in line:
            return line.lstrip("# ").split(": ", 1)[-1]
    return ""


def _model_presets() -> dict[str, ModelConfig]:
    out = {}
    for name in group_options("model"):
        out[name] = ModelConfig(**yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text()))
    return out


MODEL_PRESETS = _model_presets()
"""The model presets by name (``model=<name>``), as ModelConfig."""
