"""tmslurm's downtime at scale, part by part: one law per part instead of a measured constant.

Contract: every law is a pure function of a :class:`PartInputs` (the modelled job, the liveness
settings and the control-plane law) and, where it grows with scale, the GPU count N (one rank per
GPU). :func:`downtime_parts` returns the parts of one planned or unexpected event, in seconds,
keyed by :data:`PART_NAMES`; their sum is the event's downtime. Constants measured on this
repository's 2-core machine live in :mod:`benchmarks.sim.measured` with the file they come from
(``tests/unit/test_projection_parts.py`` checks them against ``docs/bench/*.json``).

The parts (planned = a notice ahead, unexpected = a node lost without warning)::

    detect       planned 0; unexpected detect.node_timeout_s + half the controller's 50 ms tick
    control      planned 0 (planned during the notice); unexpected: abort + recovery plan (fit)
    group_build  planned 0 (phase 1 overlaps training); unexpected: the replaced rank's groups
    phase2       planned: delta handle swap (flat) or full rebuild (linear in N); unexpected 0
    transfer     per-rank state bytes / per-GPU link bandwidth
    commit       the commit after the switch: commit latency at N (fit)
    first_step   first_step_steps x one step of the modelled job

Plus a steady-state cost outside any event: every step waits for the commit (``vote`` ->
``decision``), so a fraction commit/(step + commit) of training time is lost at every N.

Failure behaviour: invalid inputs raise :class:`~tmslurm.core.errors.ConfigError` naming the field;
nothing else is raised for finite inputs. Fits are computed from the constants below, never from
files, so the result does not depend on the working directory.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any

from benchmarks.sim.measured import (  # noqa: F401 (re-exported: the laws' inputs)
    COMMIT_P50_MS,
    COMMIT_P50_MS_4096,
    COMMIT_TARGET_MS,
    CONTROL_RANKS,
    CONTROLLER_CPU_MS_PER_STEP,
    CONTROLLER_TICK_S,
    DETECT_P50_S_MEASURED,
    RECOVERY_ABORT_MS,
    RECOVERY_PLAN_MS,
    SCALING_PP,
    SCALING_SAMPLES,
)
from tmslurm.core.errors import ConfigError

KINDS = ("planned", "unexpected")
SWITCH_MODES = ("delta", "full")
CONTROL_LAWS = ("power", "linear", "hold", "target")
PART_NAMES = ("detect_s", "control_s", "group_build_s", "phase2_s", "transfer_s", "commit_s", "first_step_s")


@dataclass(frozen=True)
class Fit:
    """A fitted law ``y(x)``: 'power' a*x^b, 'linear' a + b*x (floored at 0), 'flat' a."""

    kind: str
    a: float
    b: float = 0.0
    x_max: float = math.inf
    """Beyond this, 'hold' keeps the value at x_max (only set for held laws)."""

    def __call__(self, x: float) -> float:
        x = min(x, self.x_max)
        if self.kind == "power":
            return self.a * x**self.b
        if self.kind == "linear":
            return max(0.0, self.a + self.b * x)
        return self.a


def fit_power(xs: tuple[float, ...], ys: tuple[float, ...]) -> Fit:
    """Least squares of log y on log x: y = a * x^b."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    b = _slope(lx, ly)
    return Fit("power", math.exp(statistics.mean(ly) - b * statistics.mean(lx)), b)


def fit_linear(xs: tuple[float, ...], ys: tuple[float, ...]) -> Fit:
    """Ordinary least squares: y = a + b*x."""
    b = _slope(list(xs), list(ys))
    return Fit("linear", statistics.mean(ys) - b * statistics.mean(xs), b)


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _scaling_medians(mode: str, index: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    ranks = tuple(sorted({n for n, m in SCALING_SAMPLES if m == mode}))
    return ranks, tuple(statistics.median(s[index] for s in SCALING_SAMPLES[(n, mode)]) for n in ranks)


@cache
def control_fit(series: str, law: str) -> Fit:
    """The control-plane law ``law`` for ``series`` ('commit', 'recovery', 'cpu'), in seconds.

    Fitted to the three sizes of control_scale.json (64, 256, 1,024 simulated ranks; the 4,096
    point is not fitted). 'power' (default: the best fit for the commit and the recovery, exponent
    ~0.71 for the commit) and 'linear' extrapolate beyond 1,024;
    'hold' is the power fit held at its 1,024-rank value (a control plane whose per-step work
    stopped growing there). 'target' is issue 13's commit target, not a measurement: 5 ms at
    1,024 and 20 ms at 4,096 ranks, i.e. proportional to N; recovery and CPU are held as 'hold'.
    """
    check_choice("control_law", law, CONTROL_LAWS)
    if law == "target":
        if series == "commit":
            (n1, t1), (n2, t2) = sorted(COMMIT_TARGET_MS.items())
            b = math.log(t2 / t1) / math.log(n2 / n1)
            return Fit("power", t1 / 1000.0 / n1**b, b)
        law = "hold"
    ys_ms = {
        "commit": COMMIT_P50_MS,
        "cpu": CONTROLLER_CPU_MS_PER_STEP,
        "recovery": tuple(a + p for a, p in zip(RECOVERY_ABORT_MS, RECOVERY_PLAN_MS)),
    }[series]
    ys = tuple(y / 1000.0 for y in ys_ms)
    if law == "linear":
        return fit_linear(CONTROL_RANKS, ys)
    fit = fit_power(CONTROL_RANKS, ys)
    return dataclasses.replace(fit, x_max=max(CONTROL_RANKS)) if law == "hold" else fit


# ---------------------------------------------------------------- inputs


@dataclass(kw_only=True)
class PartInputs:
    """The modelled job, its layout and link, the liveness settings and the control-plane law.

    Defaults: GPT-3 175B (the workload the TrainMover paper's introduction names: 1,024 GPUs,
    ~34 days) in Megatron-LM's layout on H100-class machines; see docs/projection.md.
    """

    params: float = 175e9
    """Model parameters."""
    bytes_per_param: float = 14.0
    """State bytes per parameter at a step boundary: bf16 weights 2 + fp32 master weights 4 +
    fp32 Adam moments 8 (gradients are not state between steps; no ZeRO sharding: tmslurm copies a
    rank's state from a data-parallel peer, so the peer must hold the same optimizer state)."""
    tp: int = 8
    """Tensor-parallel degree (inside one 8-GPU node, over NVLink)."""
    pp: int = 8
    """Pipeline-parallel degree (96 layers -> 12 per stage); DP = N / (tp * pp)."""
    gpus_per_node: int = 8
    """GPUs per machine: a lost node replaces this many ranks at once, one per GPU."""
    link_gbps: float = 400.0
    """Inter-node bandwidth per GPU, Gbit/s (one 400 Gb/s NIC per GPU: NDR InfiniBand or 400G
    RoCE). The standby is another machine, so NVLink does not carry the state."""
    tokens_per_replica: float = 196608.0
    """Tokens per step per data-parallel replica (96 sequences x 2,048: GPT-3's 1,536-sequence
    batch at DP 16 on 1,024 GPUs, held per replica as N grows: weak scaling)."""
    achieved_tflops: float = 400.0
    """Achieved bf16 TFLOP/s per GPU (~40% of an H100's 989 dense peak; Llama 3 reports 38-43%)."""
    flops_per_param_token: float = 6.0
    """Training FLOPs per parameter per token (forward + backward, no activation recompute)."""
    step_s: float | None = None
    """One training step, s; None derives it from the five fields above."""
    first_step_steps: float = 1.0
    """Steps of the modelled job counted as the first-step part of every event."""
    node_timeout_s: float = 0.8
    """detect.node_timeout_s: a node silent this long is declared lost."""
    detect_tick_s: float = CONTROLLER_TICK_S
    """The controller's deadline tick; half of it is added to the node timeout on average."""
    heartbeat_interval_s: float = 0.2
    """detect.heartbeat_interval_s (per rank); for the heartbeat load only."""
    monitor_interval_s: float = 0.1
    """detect.monitor_interval_s (per node); for the heartbeat load only."""
    control_law: str = "power"
    """How commit latency, recovery control and controller CPU grow beyond 1,024 ranks."""
    async_commit: bool = False
    """What-if, NOT implemented in tmslurm: the next step starts before its commit arrives, so
    no training time waits for commits (the commit after a switch stays in the downtime)."""

    def __post_init__(self) -> None:
        for name in (
            "params",
            "bytes_per_param",
            "link_gbps",
            "tokens_per_replica",
            "achieved_tflops",
            "flops_per_param_token",
            "heartbeat_interval_s",
            "monitor_interval_s",
        ):
            check_positive(name, getattr(self, name))
        for name in ("first_step_steps", "node_timeout_s", "detect_tick_s"):
            check_number(name, getattr(self, name))
        for name in ("tp", "pp", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.step_s is not None:
            check_positive("step_s", self.step_s)
        check_choice("control_law", self.control_law, CONTROL_LAWS)
        if not isinstance(self.async_commit, bool):
            raise ConfigError(f"async_commit must be True or False, got {self.async_commit!r}")


def check_number(name: str, value: Any) -> float:
    """``value`` if it is a finite number >= 0, else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")
    return value


def check_positive(name: str, value: Any) -> float:
    """``value`` if it is a finite number > 0, else ConfigError naming ``name``."""
    if check_number(name, value) <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return value


def check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    """ConfigError naming ``name`` and the valid values unless ``value`` is one of them."""
    if value not in valid:
        raise ConfigError(f"{name} must be one of {', '.join(valid)}; got {value!r}")


# ---------------------------------------------------------------- the laws


def replica_gpus(p: PartInputs) -> int:
    """GPUs per data-parallel replica: tp * pp."""
    return p.tp * p.pp


def dp_degree(gpus: int, p: PartInputs) -> int:
    """Data-parallel degree N / (tp * pp); ConfigError naming gpus if N is not a multiple."""
    if gpus <= 0 or gpus % replica_gpus(p):
        raise ConfigError(f"gpus: {gpus} is not a positive multiple of tp x pp = {p.tp} x {p.pp} = {replica_gpus(p)}")
    return gpus // replica_gpus(p)


def state_bytes_per_rank(p: PartInputs) -> float:
    """Bytes a replacement rank receives: params * bytes_per_param / (tp * pp) (one model shard)."""
    return p.params * p.bytes_per_param / replica_gpus(p)


def link_bytes_per_s(p: PartInputs) -> float:
    """Per-GPU link bandwidth in bytes/s (link_gbps is Gbit/s, decimal)."""
    return p.link_gbps * 1e9 / 8.0


def transfer_s(p: PartInputs) -> float:
    """State transfer: per-rank state bytes / per-GPU link bandwidth, at line rate.

    Every replaced rank receives its own shard from a DP peer on another machine, each GPU over
    its own NIC, in parallel; so it does not grow with N under a fixed tp x pp layout.
    """
    return state_bytes_per_rank(p) / link_bytes_per_s(p)


def step_time_s(p: PartInputs) -> float:
    """One step: step_s if given, else flops_per_param_token * params * tokens_per_replica /
    (tp * pp * achieved_tflops); constant in N (weak scaling, all-reduce growth ignored)."""
    if p.step_s is not None:
        return p.step_s
    flops = p.flops_per_param_token * p.params * p.tokens_per_replica
    return flops / (replica_gpus(p) * p.achieved_tflops * 1e12)


def first_step_s(p: PartInputs) -> float:
    """The first step on the new groups: first_step_steps * one step of the modelled job."""
    return p.first_step_steps * step_time_s(p)


def detection_s(kind: str, p: PartInputs) -> float:
    """Planned: 0 (the notice comes ahead). Unexpected: node_timeout_s + detect_tick_s / 2.

    Measured on the failure lab at node_timeout_s 0.8: detection p50 0.831 s (liveness.json).
    """
    check_choice("kind", kind, KINDS)
    return 0.0 if kind == "planned" else p.node_timeout_s + p.detect_tick_s / 2.0


def affected_group_size(gpus: int, p: PartInputs) -> int:
    """Members of the groups holding a replaced rank: its DP, PP and TP groups (size > 1 only)."""
    return sum(s for s in (dp_degree(gpus, p), p.pp, p.tp) if s > 1)


@cache
def group_build_fit() -> Fit:
    """Delta phase 1 (build the leaver's groups) vs their size, linear, from scaling.json's medians.

    There the leaver's groups are its DP group (N/2) and its PP pair: N/2 + 2 members. Linear in
    the members (a per-member connect); gloo on loopback with N processes on 2 cores. Phase 1 runs
    while the other ranks train, so its samples spread widely (10.9-118.6 ms); the law lies inside
    every size's measured range, which is all three medians can say.
    """
    ranks, phase1 = _scaling_medians("delta", 0)
    return fit_linear(tuple(n // SCALING_PP + SCALING_PP for n in ranks), phase1)


def group_build_s(gpus: int, p: PartInputs) -> float:
    """Rebuilding the replaced rank's groups inside an unexpected event's pause (fit above)."""
    return group_build_fit()(affected_group_size(gpus, p))


def delta_phase2_s() -> float:
    """Delta phase 2: installing prebuilt handles, flat in N: median of scaling.json's 30 samples."""
    return statistics.median(s[1] for (n, m), v in SCALING_SAMPLES.items() if m == "delta" for s in v)


@cache
def full_rebuild_fit() -> Fit:
    """Full rebuild (every group inside the pause) vs ranks: linear, from scaling.json's medians.

    ~3 ms per rank. The 10-repeat medians (9.4 / 17.5 / 44.2 ms) bend upwards (a + c*N^2 fits them
    within 6%): N processes connecting to each other on 2 shared cores. Linear misses them by up to
    16% yet lies inside every size's measured range; it is the law kept for the extrapolation,
    because on a real cluster every rank has its own CPU and builds its connections in parallel.
    """
    return fit_linear(*_scaling_medians("full", 1))


def full_rebuild_s(gpus: int) -> float:
    """Every group rebuilt inside the pause, at ``gpus`` ranks (linear fit above)."""
    return full_rebuild_fit()(gpus)


def commit_s(gpus: int, p: PartInputs) -> float:
    """Commit latency (last vote -> decision at all ranks) at ``gpus`` ranks, per control_law.

    Single-controller measurement on 2 shared cores (64..1,024 simulated ranks); beyond 1,024 it
    is an extrapolation (:data:`COMMIT_P50_MS_4096`, measured and not fitted, is the check).
    """
    return control_fit("commit", p.control_law)(gpus)


def recovery_control_s(gpus: int, p: PartInputs) -> float:
    """Controller handling of a failure: abort to all + recovery plan to all (control_scale)."""
    return control_fit("recovery", p.control_law)(gpus)


def controller_cpu_s(gpus: int, p: PartInputs) -> float:
    """Controller CPU seconds per step at ``gpus`` ranks (control_scale.json; informational)."""
    return control_fit("cpu", p.control_law)(gpus)


def control_overhead_fraction(gpus: int, p: PartInputs) -> float:
    """Share of training time spent waiting for commits: commit / (step + commit); 0 if async."""
    if p.async_commit:
        return 0.0
    c = commit_s(gpus, p)
    return c / (step_time_s(p) + c)


def heartbeats_per_s(gpus: int, p: PartInputs) -> float:
    """Liveness messages per second to the controller: ranks / heartbeat + nodes / monitor."""
    return gpus / p.heartbeat_interval_s + gpus / p.gpus_per_node / p.monitor_interval_s


def downtime_parts(kind: str, gpus: int, p: PartInputs, mode: str = "delta") -> dict[str, float]:
    """The parts (:data:`PART_NAMES`, seconds) of one ``kind`` event at ``gpus`` GPUs.

    ``mode`` 'delta' (tmslurm's default) or 'full' (every group rebuilt inside the pause, the
    comparison row).
    """
    check_choice("kind", kind, KINDS)
    check_choice("mode", mode, SWITCH_MODES)
    dp_degree(gpus, p)
    planned = kind == "planned"
    if mode == "full":
        build, phase2 = (0.0, full_rebuild_s(gpus)) if planned else (full_rebuild_s(gpus), 0.0)
    else:
        build, phase2 = (0.0, delta_phase2_s()) if planned else (group_build_s(gpus, p), 0.0)
    return {
        "detect_s": detection_s(kind, p),
        "control_s": 0.0 if planned else recovery_control_s(gpus, p),
        "group_build_s": build,
        "phase2_s": phase2,
        "transfer_s": transfer_s(p),
        "commit_s": commit_s(gpus, p),
        "first_step_s": first_step_s(p),
    }


def downtime_s(kind: str, gpus: int, p: PartInputs, mode: str = "delta") -> float:
    """Sum of :func:`downtime_parts`."""
    return sum(downtime_parts(kind, gpus, p, mode).values())


def scale_row(gpus: int, p: PartInputs) -> dict[str, Any]:
    """Everything per N that is not a downtime: layout, transfer and control-plane figures."""
    step = step_time_s(p)
    return {
        "gpus": gpus,
        "dp": dp_degree(gpus, p),
        "affected_group_size": affected_group_size(gpus, p),
        "state_gb_per_rank": state_bytes_per_rank(p) / 1e9,
        "link_gb_per_s": link_bytes_per_s(p) / 1e9,
        "transfer_s": transfer_s(p),
        "step_s": step,
        "commit_ms": 1000.0 * commit_s(gpus, p),
        "controller_cpu_s_per_step": controller_cpu_s(gpus, p),
        "controller_cores": controller_cpu_s(gpus, p) / (step + commit_s(gpus, p)),
        "control_overhead_pct": 100.0 * control_overhead_fraction(gpus, p),
        "heartbeats_per_s": heartbeats_per_s(gpus, p),
        "extrapolated": gpus > max(CONTROL_RANKS),
        "full_rebuild_s": full_rebuild_s(gpus),
        "group_build_s": group_build_s(gpus, p),
    }
