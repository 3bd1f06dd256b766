"""The cross-field rules of a tmslurm run's configuration.

Contract: :func:`validate` checks a :class:`~.schema.RunConfig` as it stands: ranges, choices, the
layout against the nodes and the model, fault entries against the world and the steps. It is pure: it
reads no file and imports no user code (those checks run in :mod:`.compose`). Failure behaviour: the
first broken rule raises :class:`~tmslurm.core.errors.ConfigError` with one message that names the
override to change and, where there are some, the valid values; the config is returned unchanged
otherwise.
"""

from __future__ import annotations

import re

from tmslurm.core.config.faults import (
    CLUSTER_FAULTS,
    FAULT_AMOUNTS,
    FAULT_KINDS,
    FaultConfig,
    fault_amount,
    fault_ranks,
)
from tmslurm.core.config.schema import (
    BACKENDS,
    CLUSTERS,
    DEVICES,
    ON_LIMIT,
    RESTART_MODES,
    GrayConfig,
    MetricsConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    TrainConfig,
    world_size,
)
from tmslurm.core.config.slurmtime import validate_slurm_times
from tmslurm.core.errors import ConfigError


def _positive(value: int, override: str, minimum: int = 1) -> None:
    if value < minimum:
        raise ConfigError(
            f"{override}={value} is invalid: it must be >= {minimum}. Fix: pass {override}=<n> with n >= {minimum}."
        )


def _one_of(value: str, valid: tuple[str, ...], override: str) -> None:
    if value not in valid:
        raise ConfigError(
            f"{override}={value!r} is invalid; valid values: {', '.join(valid)}. Fix: pass {override}=<one of them>."
        )


def _validate_parallel(p: ParallelConfig) -> None:
    for name in ("dp", "pp", "tp", "ranks_per_node"):
        _positive(getattr(p, name), f"parallel.{name}")
    world = world_size(p)
    if p.nodes is not None:
        _positive(p.nodes, "parallel.nodes")
        if p.nodes * p.ranks_per_node != world:
            raise ConfigError(
                f"parallel.dp*pp*tp = {world} ranks does not match parallel.nodes*ranks_per_node = "
                f"{p.nodes}*{p.ranks_per_node} = {p.nodes * p.ranks_per_node}. Fix: change parallel.nodes "
                f"(or parallel.ranks_per_node) so that nodes*ranks_per_node = {world}."
            )
    elif world % p.ranks_per_node:
        raise ConfigError(
            f"parallel.ranks_per_node={p.ranks_per_node} does not divide dp*pp*tp = {world} ranks. "
            f"Fix: pass a parallel.ranks_per_node that divides {world}."
        )
    if p.zero not in (0, 1):
        raise ConfigError(f"parallel.zero={p.zero!r} is invalid; valid values: 0, 1. Fix: pass parallel.zero=0 or 1.")
    if p.zero and (p.dp < 2 or p.dp % 2):
        raise ConfigError(
            f"parallel.zero=1 shards the optimizer over data-parallel pairs (each slice's buddy is its "
            f"partner), so parallel.dp must be even and >= 2; got parallel.dp={p.dp}. Fix: pass an even "
            f"parallel.dp, or parallel.zero=0."
        )


def _validate_model(m: ModelConfig, p: ParallelConfig) -> None:
    for name in ("n_layer", "d_model", "n_head", "seq_len", "vocab"):
        _positive(getattr(m, name), f"model.{name}")
    if m.d_model % m.n_head:
        raise ConfigError(
            f"model.d_model={m.d_model} is not a multiple of model.n_head={m.n_head}. Fix: change model.n_head."
        )
    if m.n_head % p.tp:
        raise ConfigError(
            f"model.n_head={m.n_head} is not a multiple of parallel.tp={p.tp}: heads are split over the "
            f"tensor-parallel group. Fix: pass a parallel.tp that divides {m.n_head} (or change model.n_head)."
        )
    if p.pp > m.n_layer:
        raise ConfigError(
            f"parallel.pp={p.pp} is greater than model.n_layer={m.n_layer}: every stage needs at least one "
            f"block. Fix: pass parallel.pp<={m.n_layer} or a larger model.n_layer."
        )


def _validate_train(t: TrainConfig) -> None:
    for name in ("steps", "micro_batches", "micro_batch_size", "threads"):
        _positive(getattr(t, name), f"train.{name}")
    _positive(t.checkpoint_every, "train.checkpoint_every", 0)
    _one_of(t.optimizer, ("adamw", "sgd"), "train.optimizer")
    if t.lr <= 0:
        raise ConfigError(f"train.lr={t.lr} must be > 0. Fix: pass train.lr=<positive float>.")


_RATE = re.compile(r"[1-9][0-9]*(kbit|mbit|gbit)")
_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


def _validate_amount(i: int, f: FaultConfig) -> None:
    if f.kind not in FAULT_AMOUNTS:
        if f.amount:
            raise ConfigError(
                f"faults[{i}].amount={f.amount!r}: only {', '.join(FAULT_AMOUNTS)} take an amount. "
                f"Fix: remove faults[{i}].amount."
            )
        return
    a = fault_amount(f)
    if f.kind == "throttle":
        ok, want = a.isdigit() and 1 <= int(a) <= 1000, "a percent of one CPU, 1..1000"
    elif f.kind == "slowlink":
        ok, want = bool(_RATE.fullmatch(a)), "a rate such as 20mbit, 500kbit or 1gbit"
    else:
        ok, want = bool(_SECONDS.fullmatch(a)) and 0 < float(a) <= 600, "seconds, more than 0 and at most 600"
    if not ok:
        raise ConfigError(f"faults[{i}].amount={a!r} is not {want}. Fix: change faults[{i}].amount.")


def _validate_faults(cfg: RunConfig) -> None:
    world = world_size(cfg.parallel)
    for i, f in enumerate(cfg.faults):
        _one_of(f.kind, FAULT_KINDS, f"faults[{i}].kind")
        for r in fault_ranks(f):
            if not 0 <= r < world:
                what = f"faults[{i}].ranks={list(f.ranks)} names {r}," if f.ranks else f"faults[{i}].rank={r} is"
                which = "ranks" if f.ranks else "rank"
                raise ConfigError(
                    f"{what} not a training rank; valid: 0..{world - 1}. Fix: change faults[{i}].{which}."
                )
        if len(set(f.ranks)) != len(f.ranks):
            raise ConfigError(
                f"faults[{i}].ranks={list(f.ranks)} names a rank twice. Fix: list each rank once in faults[{i}].ranks."
            )
        if f.ranks and f.kind == "corrupt_shadow":
            raise ConfigError(
                f"faults[{i}]: corrupt_shadow hits one rank. Fix: use faults[{i}].rank, not faults[{i}].ranks."
            )
        _validate_amount(i, f)
        if not 0 <= f.step < cfg.train.steps:
            raise ConfigError(
                f"faults[{i}].step={f.step} is outside the run; valid: 0..{cfg.train.steps - 1}. "
                f"Fix: change faults[{i}].step."
            )
        _one_of(f.when, ("midstep", "recover", "transfer", "join"), f"faults[{i}].when")
        if f.when in ("transfer", "join") and f.kind not in ("kill", "stop", "hiccup"):
            raise ConfigError(
                f"faults[{i}].when={f.when} fits only kind=kill, stop or hiccup. "
                f"Fix: change faults[{i}].kind or faults[{i}].when."
            )
        if f.kind in CLUSTER_FAULTS and cfg.cluster != "slurm":
            raise ConfigError(
                f"faults[{i}].kind={f.kind} needs cluster=slurm (the failure lab of scripts/local-slurm). "
                "Fix: use kind=kill or kind=stop with cluster=local."
            )


def _validate_gray(g: GrayConfig, dp: int) -> None:
    _positive(g.window, "gray.window")
    _positive(g.budget_per_hour, "gray.budget_per_hour", minimum=0)
    if g.factor <= 1.0:
        raise ConfigError(
            f"gray.factor={g.factor} must be > 1 (a rank is slow when this many times its peers). "
            "Fix: pass gray.factor=<x> with x > 1."
        )
    if g.min_excess_s < 0:
        raise ConfigError("gray.min_excess_s must be >= 0. Fix: pass gray.min_excess_s=<seconds>.")
    if g.link_probe_s < 0 or 0 < g.link_probe_s < 0.1:
        raise ConfigError(
            f"gray.link_probe_s={g.link_probe_s} must be 0 (off) or at least 0.1. "
            "Fix: pass gray.link_probe_s=<seconds>."
        )
    if not 1 << 16 <= g.link_probe_bytes <= 64 << 20:
        raise ConfigError(
            f"gray.link_probe_bytes={g.link_probe_bytes} must be 64 KiB..64 MiB (65536..67108864). "
            "Fix: pass gray.link_probe_bytes=<bytes>."
        )
    if g.link_probe_timeout_s <= 0:
        raise ConfigError("gray.link_probe_timeout_s must be > 0. Fix: pass gray.link_probe_timeout_s=<seconds>.")
    if g.link_slow_factor <= 1.0:
        raise ConfigError(
            f"gray.link_slow_factor={g.link_slow_factor} must be > 1. Fix: pass gray.link_slow_factor=<x> with x > 1."
        )
    _positive(g.link_window, "gray.link_window", minimum=2)
    if g.evict and dp < 2:
        raise ConfigError(
            f"gray.evict=true judges a rank against its data-parallel peers, and parallel.dp={dp} "
            "has none. Fix: pass parallel.dp >= 2 or gray.evict=false."
        )


def _validate_metrics(m: MetricsConfig, monitors: bool) -> None:
    for name in ("port", "monitor_port"):
        port = getattr(m, name)
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics.{name}={port} is not a port. Fix: pass metrics.{name}=<1..65535> (0 = off).")
    if m.monitor_port and m.monitor_port == m.port:
        raise ConfigError(
            f"metrics.monitor_port={m.monitor_port} equals metrics.port: the batch "
            "host runs a controller and a monitor. Fix: pass another metrics.monitor_port."
        )
    if m.monitor_port and not monitors:
        raise ConfigError(
            "metrics.monitor_port needs the node monitors. Fix: pass detect.monitors=true or metrics.monitor_port=0."
        )


def _validate_durations(cfg: RunConfig) -> None:
    for section, names in (
        (
            "runtime",
            ("collective_timeout_s", "wait_slice_s", "connect_timeout_s", "switch_timeout_s", "controller_lost_s"),
        ),
        (
            "detect",
            (
                "heartbeat_interval_s",
                "heartbeat_timeout_s",
                "hang_factor",
                "hang_floor_s",
                "monitor_interval_s",
                "node_timeout_s",
            ),
        ),
    ):
        for name in names:
            if getattr(getattr(cfg, section), name) <= 0:
                raise ConfigError(f"{section}.{name} must be > 0. Fix: pass {section}.{name}=<seconds>.")


def validate(cfg: RunConfig) -> RunConfig:
    """Check every field and cross-field rule; raise ConfigError naming the override to change."""
    _validate_parallel(cfg.parallel)
    _validate_model(cfg.model, cfg.parallel)
    _validate_train(cfg.train)
    _positive(cfg.standby.max_classes, "standby.max_classes")
    _positive(cfg.standby.count, "standby.count", 0)
    _positive(cfg.standby.warmup_iters, "standby.warmup_iters")
    _one_of(cfg.cluster, CLUSTERS, "cluster")
    _one_of(cfg.runtime.backend, BACKENDS, "runtime.backend")
    _one_of(cfg.runtime.device, DEVICES, "runtime.device")
    _one_of(cfg.bench.restart_mode, RESTART_MODES, "bench.restart_mode")
    _one_of(cfg.bench.switch_mode, ("delta", "full"), "bench.switch_mode")
    _one_of(cfg.slurm.backend, ("auto", "cli", "pyslurm"), "slurm.backend")
    _one_of(cfg.slurm.on_limit, ON_LIMIT, "slurm.on_limit")
    validate_slurm_times(cfg.slurm)
    if cfg.runtime.backend == "nccl" and cfg.runtime.device != "cuda":
        raise ConfigError(
            "runtime.backend=nccl needs runtime.device=cuda. Fix: pass runtime.device=cuda or runtime.backend=gloo."
        )
    _validate_durations(cfg)
    _positive(cfg.runtime.controller_restarts, "runtime.controller_restarts", minimum=0)
    _validate_metrics(cfg.metrics, cfg.detect.monitors)
    _validate_gray(cfg.gray, cfg.parallel.dp)
    if cfg.detect.heartbeat_timeout_s <= 2 * cfg.detect.heartbeat_interval_s:
        raise ConfigError(
            "detect.heartbeat_timeout_s must exceed 2 x detect.heartbeat_interval_s. "
            "Fix: raise detect.heartbeat_timeout_s."
        )
    if cfg.detect.node_timeout_s <= 2 * max(cfg.detect.monitor_interval_s, cfg.detect.heartbeat_interval_s):
        raise ConfigError(
            "detect.node_timeout_s must exceed 2 x detect.monitor_interval_s and 2 x "
            "detect.heartbeat_interval_s. Fix: raise detect.node_timeout_s."
        )
    if cfg.runtime.relay and not (cfg.detect.monitors and cfg.bench.heartbeats):
        raise ConfigError(
            "runtime.relay=true needs the node monitors, which run the relays. Fix: set "
            "detect.monitors=true bench.heartbeats=true, or runtime.relay=false."
        )
    _validate_faults(cfg)
    if not cfg.bench.commit_vote and (cfg.faults or cfg.standby.count):
        raise ConfigError(
            "bench.commit_vote=false only measures the vote's cost: it cannot abort or switch. "
            "Fix: use it with standby.count=0 and no faults."
        )
    return cfg
