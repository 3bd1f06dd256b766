"""Configuration of a tmslurm run: schema, validation and composition from Hydra overrides.

Contract: the names callers use are re-exported here, so ``from tmslurm.core.config import X`` works
for all of them. The package is split by what each part touches:

- :mod:`.schema`: the kw-only dataclasses with field docstrings (root :class:`RunConfig`), registered in
  Hydra's ConfigStore; :mod:`.faults`: one injected fault's schema;
- :mod:`.validation`: the cross-field rules (:func:`validate`), pure;
- :mod:`.slurmtime`: the Slurm time limits and leads (``slurm.time``, ``slurm.spare_*``, ``slurm.signal_lead_s``);
- :mod:`.dicts`: a config as plain data (config.json, what ranks receive);
- :mod:`.compose`: Hydra composition, presets, the file-system checks and the import of the user's Task.

Failure behaviour: every invalid input raises :class:`~tmslurm.core.errors.ConfigError` with one
message that names the override to change.
"""

from tmslurm.core.config.compose import apply_cluster_defaults, check_environment, compose_config
from tmslurm.core.config.dicts import from_dict, to_dataclass, to_dict
from tmslurm.core.config.faults import (
    CLUSTER_FAULTS,
    FAULT_AMOUNTS,
    FAULT_KINDS,
    FaultConfig,
    fault_amount,
    fault_ranks,
)
from tmslurm.core.config.presets import CONF_DIR, MODEL_PRESETS, group_options
from tmslurm.core.config.schema import (
    BACKENDS,
    BENCH_SECTIONS,
    CLUSTERS,
    DEVICES,
    ON_LIMIT,
    RESTART_MODES,
    SLURM_CHECKPOINT_EVERY,
    BenchConfig,
    DetectConfig,
    GrayConfig,
    MetricsConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    RuntimeConfig,
    SecurityConfig,
    ShadowConfig,
    SlurmConfig,
    StandbyConfig,
    TrainConfig,
    num_nodes,
    register_configs,
    wants_monitors,
    world_size,
)
from tmslurm.core.config.validation import validate

__all__ = [
    "BACKENDS",
    "BENCH_SECTIONS",
    "CLUSTERS",
    "CLUSTER_FAULTS",
    "DEVICES",
    "FAULT_AMOUNTS",
    "FAULT_KINDS",
    "CONF_DIR",
    "MODEL_PRESETS",
    "group_options",
    "ON_LIMIT",
    "RESTART_MODES",
    "SLURM_CHECKPOINT_EVERY",
    "FaultConfig",
    "BenchConfig",
    "DetectConfig",
    "GrayConfig",
    "MetricsConfig",
    "ModelConfig",
    "ParallelConfig",
    "RunConfig",
    "RuntimeConfig",
    "SecurityConfig",
    "ShadowConfig",
    "SlurmConfig",
    "StandbyConfig",
    "TrainConfig",
    "apply_cluster_defaults",
    "check_environment",
    "compose_config",
    "fault_amount",
    "fault_ranks",
    "from_dict",
    "num_nodes",
    "register_configs",
    "to_dataclass",
    "to_dict",
    "validate",
    "wants_monitors",
    "world_size",
]
