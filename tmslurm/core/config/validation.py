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
    ModelConfig,
    ParallelConfig,
    RunConfig,
    RuntimeConfig,
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


def _validate_gray(cfg: RunConfig) -> None:
    rt = cfg.runtime
    _positive(rt.gray_window, "runtime.gray_window")
    _positive(rt.gray_budget_per_hour, "runtime.gray_budget_per_hour", minimum=0)
    if rt.gray_factor <= 1.0:
        raise ConfigError(
            f"runtime.gray_factor={rt.gray_factor} must be > 1 (a rank is slow when this many times its peers). "
            "Fix: pass runtime.gray_factor=<x> with x > 1."
        )
    if rt.gray_min_excess_s < 0:
        raise ConfigError("runtime.gray_min_excess_s must be >= 0. Fix: pass runtime.gray_min_excess_s=<seconds>.")
    if rt.link_probe_s < 0 or 0 < rt.link_probe_s < 0.1:
        raise ConfigError(
            f"runtime.link_probe_s={rt.link_probe_s} must be 0 (off) or at least 0.1. "
            "Fix: pass runtime.link_probe_s=<seconds>."
        )
    if not 1 << 16 <= rt.link_probe_bytes <= 64 << 20:
        raise ConfigError(
            f"runtime.link_probe_bytes={rt.link_probe_bytes} must be 64 KiB..64 MiB (65536..67108864). "
            "Fix: pass runtime.link_probe_bytes=<bytes>."
        )
    if rt.link_probe_timeout_s <= 0:
        raise ConfigError("runtime.link_probe_timeout_s must be > 0. Fix: pass runtime.link_probe_timeout_s=<seconds>.")
    if rt.link_slow_factor <= 1.0:
        raise ConfigError(
            f"runtime.link_slow_factor={rt.link_slow_factor} must be > 1. "
            "Fix: pass runtime.link_slow_factor=<x> with x > 1."
        )
    _positive(rt.link_window, "runtime.link_window", minimum=2)
    if rt.gray_evict and cfg.parallel.dp < 2:
        raise ConfigError(
            f"runtime.gray_evict=true judges a rank against its data-parallel peers, and parallel.dp={cfg.parallel.dp} "
            "has none. Fix: pass parallel.dp >= 2 or runtime.gray_evict=false."
        )


def _validate_metrics(rt: RuntimeConfig) -> None:
    for name in ("metrics_port", "monitor_metrics_port"):
        port = getattr(rt, name)
        if not 0 <= port <= 65535:
            raise ConfigError(f"runtime.{name}={port} is not a port. Fix: pass runtime.{name}=<1..65535> (0 = off).")
    if rt.monitor_metrics_port and rt.monitor_metrics_port == rt.metrics_port:
        raise ConfigError(
            f"runtime.monitor_metrics_port={rt.monitor_metrics_port} equals runtime.metrics_port: the batch "
            "host runs a controller and a monitor. Fix: pass another runtime.monitor_metrics_port."
        )
    if rt.monitor_metrics_port and not rt.monitors:
        raise ConfigError(
            "runtime.monitor_metrics_port needs the node monitors. Fix: pass runtime.monitors=true "
            "or runtime.monitor_metrics_port=0."
        )


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
    _one_of(cfg.runtime.restart_mode, RESTART_MODES, "runtime.restart_mode")
    _one_of(cfg.runtime.switch_mode, ("delta", "full"), "runtime.switch_mode")
    _one_of(cfg.slurm.backend, ("auto", "cli", "pyslurm"), "slurm.backend")
    _one_of(cfg.slurm.on_limit, ON_LIMIT, "slurm.on_limit")
    validate_slurm_times(cfg.slurm)
    if cfg.runtime.backend == "nccl" and cfg.runtime.device != "cuda":
        raise ConfigError(
            "runtime.backend=nccl needs runtime.device=cuda. Fix: pass runtime.device=cuda or runtime.backend=gloo."
        )
    for name in (
        "heartbeat_interval_s",
        "heartbeat_timeout_s",
        "collective_timeout_s",
        "wait_slice_s",
        "connect_timeout_s",
        "hang_factor",
        "hang_floor_s",
        "switch_timeout_s",
        "controller_lost_s",
        "monitor_interval_s",
        "node_timeout_s",
    ):
        if getattr(cfg.runtime, name) <= 0:
            raise ConfigError(f"runtime.{name} must be > 0. Fix: pass runtime.{name}=<seconds>.")
    _positive(cfg.runtime.controller_restarts, "runtime.controller_restarts", minimum=0)
    _validate_metrics(cfg.runtime)
    _validate_gray(cfg)
    if cfg.runtime.heartbeat_timeout_s <= 2 * cfg.runtime.heartbeat_interval_s:
        raise ConfigError(
            "runtime.heartbeat_timeout_s must exceed 2 x runtime.heartbeat_interval_s. "
            "Fix: raise runtime.heartbeat_timeout_s."
        )
    if cfg.runtime.node_timeout_s <= 2 * max(cfg.runtime.monitor_interval_s, cfg.runtime.heartbeat_interval_s):
        raise ConfigError(
            "runtime.node_timeout_s must exceed 2 x runtime.monitor_interval_s and 2 x "
            "runtime.heartbeat_interval_s. Fix: raise runtime.node_timeout_s."
        )
    if cfg.runtime.relay and not (cfg.runtime.monitors and cfg.runtime.heartbeats):
        raise ConfigError(
            "runtime.relay=true needs the node monitors, which run the relays. Fix: set "
            "runtime.monitors=true runtime.heartbeats=true, or runtime.relay=false."
        )
    _validate_faults(cfg)
    if not cfg.runtime.commit_vote and (cfg.faults or cfg.standby.count):
        raise ConfigError(
            "runtime.commit_vote=false only measures the vote's cost: it cannot abort or switch. "
            "Fix: use it with standby.count=0 and no faults."
        )
    return cfg
