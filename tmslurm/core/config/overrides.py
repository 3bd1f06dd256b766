"""The command line's overrides checked against the schema before Hydra sees them.

Contract: :func:`check_overrides` takes ``tmslurm-launch``'s overrides and returns them ready for Hydra's
compose: every key is a key of the schema, a config group (``cluster``, ``model``, ``+experiment``) or
``faults`` (entries are checked after composition); a group names one of its presets; ``hydra.run.dir=DIR``
becomes ``run_dir=DIR`` (the run directory; tmslurm composes with Hydra's compose API, which has no
hydra.* settings, so they were silently ignored before). Failure behaviour: an unknown key raises
:class:`~tmslurm.core.errors.ConfigError` ``unknown key parallel.dpp; did you mean parallel.dp?`` (the
closest keys of the schema by difflib, for ``+key`` too), a key that moved to another section names its
new home (:data:`MOVED`: ``runtime.gray_evict moved to gray.evict``), an unknown preset names the valid
ones, any other ``hydra.*`` key is refused naming the fix. An override without ``=`` is left for Hydra to report.
"""

from __future__ import annotations

import difflib

from tmslurm.core.config.fielddocs import keys, sections
from tmslurm.core.config.presets import APPENDED_GROUPS, GROUPS, group_options
from tmslurm.core.errors import ConfigError

RUN_DIR_ALIAS = "hydra.run.dir"
MOVED = {
    "runtime.heartbeat_interval_s": "detect.heartbeat_interval_s",
    "runtime.heartbeat_timeout_s": "detect.heartbeat_timeout_s",
    "runtime.hang_factor": "detect.hang_factor",
    "runtime.hang_floor_s": "detect.hang_floor_s",
    "runtime.monitors": "detect.monitors",
    "runtime.monitor_interval_s": "detect.monitor_interval_s",
    "runtime.node_timeout_s": "detect.node_timeout_s",
    "runtime.verify_replicas": "detect.verify_replicas",
    "runtime.shadow": "shadow.enabled",
    "runtime.shadow_min_notice_s": "shadow.min_notice_s",
    "runtime.shadow_catchup_timeout_s": "shadow.catchup_timeout_s",
    "runtime.gray_evict": "gray.evict",
    "runtime.gray_factor": "gray.factor",
    "runtime.gray_window": "gray.window",
    "runtime.gray_min_excess_s": "gray.min_excess_s",
    "runtime.gray_budget_per_hour": "gray.budget_per_hour",
    "runtime.link_probe_s": "gray.link_probe_s",
    "runtime.link_probe_bytes": "gray.link_probe_bytes",
    "runtime.link_probe_timeout_s": "gray.link_probe_timeout_s",
    "runtime.link_slow_factor": "gray.link_slow_factor",
    "runtime.link_window": "gray.link_window",
    "runtime.metrics_port": "metrics.port",
    "runtime.monitor_metrics_port": "metrics.monitor_port",
    "runtime.metrics_addr": "metrics.addr",
    "runtime.admin_public_key_file": "security.admin_public_key_file",
    "runtime.notice_max_age_s": "security.notice_max_age_s",
    "runtime.restart_mode": "bench.restart_mode",
    "runtime.switch_mode": "bench.switch_mode",
    "runtime.commit_vote": "bench.commit_vote",
    "runtime.heartbeats": "bench.heartbeats",
    "train.step_delay_s": "bench.step_delay_s",
}
"""Keys that moved when runtime was split by concern: old override path -> new one (named in the error)."""


def schema_keys() -> list[str]:
    """Every key an override may set: section.field, the sections, the top-level keys."""
    return [k.path for k in keys() if not k.section.startswith("faults")] + [name for name, _ in sections()]


def closest(key: str, candidates: list[str]) -> str | None:
    """The candidate most like ``key`` (difflib, at least 0.6 alike); of equals, the one sharing the longest
    start with it (parallel.dpp: parallel.dp, not parallel.pp)."""
    close = difflib.get_close_matches(key, candidates, n=5, cutoff=0.6)
    if not close:
        return None

    def rank(c: str) -> tuple[float, int]:
        return (difflib.SequenceMatcher(None, key, c).ratio(), _common_start(key, c))

    return max(close, key=rank)


def _common_start(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _split(override: str) -> tuple[str, str, str] | None:
    """(prefix, key, value) of ``[+|++|~]key[@package]=value``; None without ``=`` (Hydra reports it)."""
    if "=" not in override:
        return None if not override.startswith("~") else ("~", override[1:].split("@")[0], "")
    head, value = override.split("=", 1)
    prefix = head[: len(head) - len(head.lstrip("+~"))]
    return prefix, head[len(prefix) :].split("@")[0], value


def _unknown(key: str) -> ConfigError:
    close = closest(key, schema_keys() + list(GROUPS) + list(MOVED))
    if close in MOVED:
        return ConfigError(f"unknown key {key}; did you mean {MOVED[close]}? ({close} moved to {MOVED[close]})")
    if close:
        return ConfigError(f"unknown key {key}; did you mean {close}?")
    return ConfigError(f"unknown key {key}; tmslurm-launch --help and docs/config-reference.md list the keys")


def _check_group(prefix: str, group: str, value: str) -> None:
    options = group_options(group)
    if prefix != "~" and value not in options:
        raise ConfigError(
            f"{group}={value} is not a preset of {group}; valid values: {', '.join(options)}. "
            f"Fix: pass {'+' if group in APPENDED_GROUPS else ''}{group}=<one of them>."
        )
    if group in APPENDED_GROUPS and not prefix.startswith("+"):
        raise ConfigError(f"{group} has no default preset to change. Fix: pass +{group}={value}.")


def _check_hydra(key: str, value: str, overrides: list[str]) -> str:
    if key != RUN_DIR_ALIAS:
        raise ConfigError(
            f"{key} is not used: tmslurm composes its config with Hydra's compose API, which has no hydra.* "
            f"settings. Fix: remove {key} (hydra.run.dir=DIR is the one taken, as run_dir=DIR)."
        )
    if any((_split(o) or ("", "", ""))[1] == "run_dir" for o in overrides):
        raise ConfigError("hydra.run.dir and run_dir both name the run directory. Fix: pass only run_dir=DIR.")
    return f"run_dir={value}"


def check_overrides(overrides: list[str]) -> list[str]:
    """The overrides with hydra.run.dir turned into run_dir; a ConfigError for an unknown key or preset."""
    known = set(schema_keys())
    out = []
    for override in overrides:
        parts = _split(override)
        if parts is None:
            out.append(override)
            continue
        prefix, key, value = parts
        if key.startswith("hydra."):
            out.append(_check_hydra(key, value, overrides))
            continue
        if key in GROUPS and not (key in known and value.startswith("{")):
            _check_group(prefix, key, value)
        elif not (key in known or key == "faults" or key.startswith(("faults[", "faults."))):
            raise _unknown(key)
        out.append(override)
    return out
