"""The projection's model: interruption rates, per-event downtimes per strategy, wasted GPU-hours.

Contract: pure functions of a :class:`ProjectionInputs`. Per GPU count N and strategy::

    interruptions/week = 168 h / MTTF(N)      split planned : unexpected = 1 : 8.9
    downtime GPU-h/wk  = N * (planned/week * d_planned + unexpected/week * d_unexpected) / 3600
    control GPU-h/wk   = N * (168 h - downtime h/week) * commit / (step + commit)   (tmslurm only)
    wasted GPU-h/week  = downtime + control + standby GPUs * 168 h

``d`` is the paper's production breakdown for checkpoint restart, the paper's measured figures for
TrainMover, :mod:`benchmarks.sim.parts` (one law per part) for ``tmslurm`` and
``tmslurm_full_rebuild``, and constants given by the user for ``tmslurm_measured``. Every
modelling choice is a sentence in :data:`ASSUMPTIONS`.

Failure behaviour: invalid inputs raise :class:`~tmslurm.core.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from benchmarks.sim import parts as pt
from tmslurm.core.errors import ConfigError

HOURS_PER_WEEK = 168.0
DEFAULT_GPUS = (1024, 8192, 16384, 65536, 131072)

#: Production checkpoint-restart breakdown at 8,192 GPUs (TrainMover paper), minutes.
RESTART_BREAKDOWN_MIN = {
    "stop": 0.52,
    "reschedule": 1.50,
    "checkpoint_load": 1.56,
    "communicator_setup": 1.09,
    "warmup": 1.80,
}
#: MTTF anchors (GPUs, hours): Meta's 1,024-GPU jobs; Llama 3 on 16,384 GPUs.
MTTF_ANCHORS = ((1024, 7.9), (16384, 2.7))
#: TrainMover's measured downtimes (seconds) at 32 and 1,024 GPUs.
TRAINMOVER_DOWNTIME_S = {"planned": {32: 11.5, 1024: 16.6}, "unexpected": {32: 19.6, 1024: 21.0}}
MTTF_RULES = ("loglog", "power_fit", "inverse_1k", "inverse_16k")
BEYOND_RULES = ("extrapolate", "hold")
#: tmslurm's component model: switch mode per strategy.
TMSLURM_MODES = {"tmslurm": "delta", "tmslurm_full_rebuild": "full"}
STRATEGIES = ("checkpoint_restart", "trainmover_paper", *TMSLURM_MODES, "tmslurm_measured")

#: Every modelling choice; formatted with :func:`assumption_values`.
ASSUMPTIONS = [
    "GPU counts are powers of two: 1K = 1,024, 8K = 8,192, 16K = 16,384, 64K = 65,536, "
    "128K = 131,072 GPUs; a week is 168 h of training.",
    "MTTF anchors: 7.9 h at 1,024 GPUs and 2.7 h at 16,384 GPUs. Rule '{mttf_rule}' (default "
    "'loglog'): log-log interpolation between the anchors (MTTF ~ N^{loglog_exponent:.3f}, i.e. "
    "interruption rate ~ N^{rate_exponent:.3f}) and pure 1/N beyond them (MTTF = 2.7 h * 16,384/N "
    "above, 7.9 h * 1,024/N below). Pure 1/N cannot pass through both anchors (1/N from 1K gives "
    "0.49 h at 16K, not 2.7 h), so 'scaling as 1/N in between and beyond' holds exactly only "
    "beyond the anchors; the alternatives are printed under 'sensitivity'.",
    "Interruptions split planned : unexpected = 1 : {unexpected_per_planned:g} (Llama 3: 47 "
    "planned, 419 unexpected in 54 days); every interruption stops the whole job.",
    "Checkpoint restart costs {restart_fixed_min:g} min per interruption (production breakdown at "
    "8,192 GPUs: stop 0.52 + reschedule 1.50 + checkpoint load 1.56 + communicator setup 1.09 + "
    "warm-up 1.80 min), plus {reschedule_extra_min:g} min of rescheduling per restart as the paper "
    "adds for baselines, held constant at every N (measured at 8K only).",
    "Checkpoint restart also loses the progress since the last checkpoint: checkpoints every "
    "{checkpoint_interval_min:g} min, so an unexpected interruption loses half of that "
    "({half_interval_min:g} min) on average; planned interruptions "
    "{planned_loss_text}. Checkpoint save cost is not counted.",
    "TrainMover (paper) downtimes: planned 11.5 s at 32 GPUs / 16.6 s at 1,024; unexpected 19.6 s "
    "/ 21.0 s; linear in log2(N) between 32 and 1,024 GPUs; beyond 1,024 rule '{trainmover_beyond}'"
    " ('extrapolate' continues the log-linear trend, +1.02 s planned and +0.28 s unexpected per "
    "doubling; 'hold' keeps the 1,024-GPU values); held at the 32-GPU values below 32 GPUs.",
    "TrainMover and tmslurm: unexpected failures of a stage without a data-parallel copy (which "
    "roll the job back to a checkpoint) are not modelled; every failure is assumed to find a "
    "live DP peer and a warm standby (no concurrent failures beyond the standby pool).",
    "Standby cost: {standby_gpus:g} GPUs (one 8-GPU machine) idle all week = "
    "{standby_gpu_hours:g} GPU-h/week counted as waste for TrainMover and tmslurm; one standby is "
    "assumed enough at every N (it is replenished between interruptions).",
    "tmslurm (component model) runs a {params_b:g}B-parameter GPT in DP x PP {pp} x TP {tp} "
    "(DP = N/{replica}), one rank per GPU, {gpus_per_node} GPUs per machine; one step takes "
    "{step_s:.2f} s ({step_source}); the step time does not change with N (weak scaling).",
    "State transfer: each replaced rank receives {state_gb:.1f} GB ({bytes_per_param:g} bytes/param"
    " / (TP x PP)) from a data-parallel peer over its own {link_gbps:g} Gb/s link at line rate: "
    "{transfer_s:.3f} s, the same at every N.",
    "Detection: planned events 0 (a notice ahead; phase 1 and the plan overlap training); "
    "unexpected node_timeout_s {node_timeout_s:g} s + half the controller's {detect_tick_s:g} s "
    "tick = {detect_s:.3f} s (measured p50 0.831 s at 0.8 s on the failure lab).",
    "Groups: a planned switch installs prebuilt handles (delta phase 2, flat, {delta_us:.0f} us in "
    "scaling.json); an unexpected failure rebuilds the replaced rank's DP, PP and TP groups inside "
    "the pause, linear in their members ({build_ms:.1f} ms per member, fitted to scaling.json's "
    "delta phase 1: gloo on loopback, 2 shared cores); the tmslurm_full_rebuild row rebuilds "
    "every group instead, linear in N ({full_ms:.2f} ms per rank, scaling.json's full phase 2).",
    "Control plane: commit latency, the controller's failure handling (abort + recovery plan) and "
    "its CPU per step follow the '{control_law}' law fitted to control_scale.json (64..1,024 "
    "simulated ranks, ONE controller on 2 shared cores; beyond 1,024 ranks an extrapolation): "
    "commit {commit_1k_ms:,.1f} ms at 1K GPUs, {commit_128k_s:,.2f} s at 128K (the one measured "
    "point beyond the fit, 4,096 ranks, not fitted: {commit_4096_measured_ms:.1f} ms; this law "
    "gives {commit_4096_ms:.1f} ms there). The commit after "
    "the switch is in every event's downtime, and every step waits for one commit, so "
    "commit / (step + commit) of the training time is lost all week (control GPU-h){async_text}.",
    "First step: {first_step_steps:g} x one step ({first_step_s:.2f} s) is counted in every "
    "event. A warm standby's first step only costs its excess over a normal step, so for planned "
    "events this is an upper bound; for unexpected ones it stands for the lost in-flight step.",
    "tmslurm_measured (only with --downtime-json or --planned-s/--unexpected-s): downtimes "
    "{measured_text}, held constant at every N, without control-plane cost.",
    "Claims: '55% less waste at 64K' is checked as the reduction vs checkpoint restart at 65,536 "
    "GPUs (the paper compares against its best alternative, which this model does not contain) "
    "and agrees within +/-10 points; '1.4M GPU-h/week saved at 64K' agrees within +/-20%; 'a "
    "standby is not worth it at 1K' agrees if TrainMover's waste incl. standby >= restart's.",
]


@dataclass(kw_only=True)
class ProjectionInputs:
    """Everything the projection depends on; defaults are the paper's figures."""

    tmslurm_planned_s: float | None = None
    """Measured planned downtime held constant (the tmslurm_measured rows); None: no such rows."""
    tmslurm_unexpected_s: float | None = None
    """Measured unexpected downtime held constant; given together with tmslurm_planned_s."""
    tmslurm_source: str = "not given"
    """Where the constant downtimes came from (a file path or 'command line'); printed only."""
    parts: pt.PartInputs = field(default_factory=pt.PartInputs)
    """tmslurm's component model: the job, its layout and link, liveness, the control law."""
    gpus: tuple[int, ...] = DEFAULT_GPUS
    """GPU counts to project (multiples of parts.tp x parts.pp)."""
    checkpoint_interval_min: float = 30.0
    """Minutes between checkpoints of the restart baseline; half is lost per unexpected failure."""
    planned_loses_progress: bool = False
    """Whether planned interruptions also lose half a checkpoint interval (default: the baseline
    checkpoints just before a planned stop)."""
    restart_fixed_min: float = round(sum(RESTART_BREAKDOWN_MIN.values()), 2)
    """Fixed restart cost per interruption, minutes (production breakdown at 8,192 GPUs)."""
    reschedule_extra_min: float = 2.0
    """Extra rescheduling per restart for baselines, minutes (as the paper adds)."""
    mttf_rule: str = "loglog"
    """How MTTF scales with N: one of MTTF_RULES."""
    unexpected_per_planned: float = 8.9
    """Unexpected interruptions per planned one."""
    standby_gpus: int = 8
    """Idle standby GPUs counted as waste all week for TrainMover and tmslurm."""
    trainmover_beyond: str = "extrapolate"
    """TrainMover downtime beyond 1,024 GPUs: 'extrapolate' (log-linear) or 'hold'."""

    def __post_init__(self) -> None:
        for name in ("checkpoint_interval_min", "restart_fixed_min", "reschedule_extra_min", "standby_gpus"):
            setattr(self, name, pt.check_number(name, getattr(self, name)))
        given = [n for n in ("tmslurm_planned_s", "tmslurm_unexpected_s") if getattr(self, n) is not None]
        for name in given:
            pt.check_number(name, getattr(self, name))
        if len(given) == 1:
            raise ConfigError(
                f"{given[0]} was given without its pair: give both "
                "tmslurm_planned_s and tmslurm_unexpected_s, or neither"
            )
        if pt.check_number("unexpected_per_planned", self.unexpected_per_planned) <= 0:
            raise ConfigError("unexpected_per_planned must be > 0")
        if not isinstance(self.parts, pt.PartInputs):
            raise ConfigError(f"parts must be a PartInputs, got {self.parts!r}")
        if not isinstance(self.gpus, (tuple, list)):
            raise ConfigError(f"gpus must be a tuple of GPU counts, got {self.gpus!r}")
        self.gpus = tuple(_gpu_count(g) for g in self.gpus)
        if not self.gpus:
            raise ConfigError("gpus must list at least one GPU count")
        for gpus in self.gpus:
            pt.dp_degree(gpus, self.parts)
        pt.check_choice("mttf_rule", self.mttf_rule, MTTF_RULES)
        pt.check_choice("trainmover_beyond", self.trainmover_beyond, BEYOND_RULES)

    @property
    def measured(self) -> bool:
        """Whether constant (measured) tmslurm downtimes were given."""
        return self.tmslurm_planned_s is not None


def _gpu_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"gpus must be positive integers, got {value!r}")
    return value


def vary(inputs: ProjectionInputs, **change: Any) -> ProjectionInputs:
    """``inputs`` with fields changed; names of :class:`~benchmarks.sim.parts.PartInputs` fields
    change ``inputs.parts``."""
    part_names = {f.name for f in dataclasses.fields(pt.PartInputs)}
    part_change = {k: v for k, v in change.items() if k in part_names}
    top = {k: v for k, v in change.items() if k not in part_names}
    return dataclasses.replace(inputs, parts=dataclasses.replace(inputs.parts, **part_change), **top)


def strategies_of(inputs: ProjectionInputs) -> tuple[str, ...]:
    """The strategies projected: tmslurm_measured only when constant downtimes were given."""
    return tuple(s for s in STRATEGIES if s != "tmslurm_measured" or inputs.measured)


# ---------------------------------------------------------------- rates and downtimes


def loglog_exponent() -> float:
    """Exponent b of MTTF = a * N^b through the two anchors (about -0.387)."""
    (n1, m1), (n2, m2) = MTTF_ANCHORS
    return math.log(m2 / m1) / math.log(n2 / n1)


def mttf_hours(gpus: int, rule: str = "loglog") -> float:
    """Mean time to interruption of a job on ``gpus`` GPUs, hours, under ``rule``."""
    pt.check_choice("mttf_rule", rule, MTTF_RULES)
    (n1, m1), (n2, m2) = MTTF_ANCHORS
    if rule == "power_fit":
        return m1 * (gpus / n1) ** loglog_exponent()
    if rule == "inverse_1k" or (rule == "loglog" and gpus <= n1):
        return m1 * n1 / gpus
    if rule == "inverse_16k" or gpus >= n2:
        return m2 * n2 / gpus
    return m1 * (gpus / n1) ** loglog_exponent()


def interruptions_per_week(gpus: int, inputs: ProjectionInputs) -> tuple[float, float, float]:
    """(total, planned, unexpected) interruptions per week at ``gpus`` GPUs."""
    total = HOURS_PER_WEEK / mttf_hours(gpus, inputs.mttf_rule)
    planned = total / (1.0 + inputs.unexpected_per_planned)
    return total, planned, total - planned


def trainmover_downtime_s(kind: str, gpus: int, beyond: str = "extrapolate") -> float:
    """The paper's downtime for ``kind`` ('planned'/'unexpected') at ``gpus`` GPUs, seconds."""
    pt.check_choice("kind", kind, tuple(TRAINMOVER_DOWNTIME_S))
    pt.check_choice("trainmover_beyond", beyond, BEYOND_RULES)
    (lo, d_lo), (hi, d_hi) = sorted(TRAINMOVER_DOWNTIME_S[kind].items())
    x = max(0.0, math.log(gpus / lo) / math.log(hi / lo))
    if beyond == "hold":
        x = min(x, 1.0)
    return d_lo + (d_hi - d_lo) * x


def restart_downtime_s(inputs: ProjectionInputs) -> tuple[float, float]:
    """(planned, unexpected) downtime of one checkpoint restart, seconds, lost progress included."""
    fixed = (inputs.restart_fixed_min + inputs.reschedule_extra_min) * 60.0
    lost = inputs.checkpoint_interval_min * 60.0 / 2.0
    return fixed + (lost if inputs.planned_loses_progress else 0.0), fixed + lost


def strategy_parts(strategy: str, kind: str, gpus: int, inputs: ProjectionInputs) -> dict[str, float] | None:
    """The component parts of one event for a tmslurm component-model strategy, else None."""
    mode = TMSLURM_MODES.get(strategy)
    return None if mode is None else pt.downtime_parts(kind, gpus, inputs.parts, mode)


def strategy_downtimes_s(strategy: str, gpus: int, inputs: ProjectionInputs) -> tuple[float, float]:
    """(planned, unexpected) per-event downtime of ``strategy`` at ``gpus`` GPUs, seconds."""
    if strategy == "checkpoint_restart":
        return restart_downtime_s(inputs)
    if strategy == "trainmover_paper":
        return (
            trainmover_downtime_s("planned", gpus, inputs.trainmover_beyond),
            trainmover_downtime_s("unexpected", gpus, inputs.trainmover_beyond),
        )
    if strategy in TMSLURM_MODES:
        mode = TMSLURM_MODES[strategy]
        return (
            pt.downtime_s("planned", gpus, inputs.parts, mode),
            pt.downtime_s("unexpected", gpus, inputs.parts, mode),
        )
    pt.check_choice("strategy", strategy, STRATEGIES)
    planned, unexpected = inputs.tmslurm_planned_s, inputs.tmslurm_unexpected_s
    if planned is None or unexpected is None:
        raise ConfigError("tmslurm_measured needs tmslurm_planned_s and tmslurm_unexpected_s")
    return planned, unexpected


def standby_gpus_of(strategy: str, inputs: ProjectionInputs) -> int:
    """Idle standby GPUs a strategy keeps all week (none for checkpoint restart)."""
    return 0 if strategy == "checkpoint_restart" else inputs.standby_gpus


def downtime_gpu_hours(gpus: int, strategy: str, inputs: ProjectionInputs) -> float:
    """GPU-hours per week lost inside interruptions."""
    _, planned, unexpected = interruptions_per_week(gpus, inputs)
    d_planned, d_unexpected = strategy_downtimes_s(strategy, gpus, inputs)
    return gpus * (planned * d_planned + unexpected * d_unexpected) / 3600.0


def control_gpu_hours(gpus: int, strategy: str, inputs: ProjectionInputs) -> float:
    """GPU-hours per week spent waiting for commits while training (component model only)."""
    if strategy not in TMSLURM_MODES:
        return 0.0
    training_h = max(0.0, HOURS_PER_WEEK - downtime_gpu_hours(gpus, strategy, inputs) / gpus)
    return gpus * training_h * pt.control_overhead_fraction(gpus, inputs.parts)


def wasted_gpu_hours(gpus: int, strategy: str, inputs: ProjectionInputs) -> float:
    """Wasted GPU-hours per week of ``strategy`` at ``gpus`` GPUs: downtime, control, standby."""
    return (
        downtime_gpu_hours(gpus, strategy, inputs)
        + control_gpu_hours(gpus, strategy, inputs)
        + standby_gpus_of(strategy, inputs) * HOURS_PER_WEEK
    )


def reduction_pct(waste: float, baseline: float) -> float:
    """Percent less waste than ``baseline`` (negative when worse)."""
    return 100.0 * (1.0 - waste / baseline) if baseline > 0 else 0.0


def rows_at(gpus: int, inputs: ProjectionInputs) -> list[dict]:
    """One row per strategy at ``gpus`` GPUs (JSON-able)."""
    total, planned, unexpected = interruptions_per_week(gpus, inputs)
    baseline = wasted_gpu_hours(gpus, "checkpoint_restart", inputs)
    rows = []
    for strategy in strategies_of(inputs):
        d_planned, d_unexpected = strategy_downtimes_s(strategy, gpus, inputs)
        waste = wasted_gpu_hours(gpus, strategy, inputs)
        row = {
            "gpus": gpus,
            "strategy": strategy,
            "mttf_h": mttf_hours(gpus, inputs.mttf_rule),
            "interruptions_per_week": total,
            "planned_per_week": planned,
            "unexpected_per_week": unexpected,
            "downtime_s_planned": d_planned,
            "downtime_s_unexpected": d_unexpected,
            "downtime_gpu_hours_per_week": downtime_gpu_hours(gpus, strategy, inputs),
            "control_gpu_hours_per_week": control_gpu_hours(gpus, strategy, inputs),
            "standby_gpu_hours_per_week": standby_gpus_of(strategy, inputs) * HOURS_PER_WEEK,
            "wasted_gpu_hours_per_week": waste,
            "reduction_vs_restart_pct": reduction_pct(waste, baseline),
        }
        if strategy in TMSLURM_MODES:
            row["parts_planned"] = strategy_parts(strategy, "planned", gpus, inputs)
            row["parts_unexpected"] = strategy_parts(strategy, "unexpected", gpus, inputs)
        rows.append(row)
    return rows


def assumption_values(inputs: ProjectionInputs) -> dict[str, Any]:
    """The values :data:`ASSUMPTIONS` are formatted with."""
    p = inputs.parts
    values = {k: v for k, v in dataclasses.asdict(inputs).items() if k != "parts"}
    values.update(dataclasses.asdict(p))
    derived = (
        "given as step_s"
        if p.step_s is not None
        else (
            f"{p.flops_per_param_token:g} x params x {p.tokens_per_replica:,.0f} tokens per replica / "
            f"({pt.replica_gpus(p)} GPUs x {p.achieved_tflops:g} TFLOP/s)"
        )
    )
    measured = (
        f"planned {inputs.tmslurm_planned_s:g} s, unexpected "
        f"{inputs.tmslurm_unexpected_s:g} s ({inputs.tmslurm_source})"
        if inputs.measured
        else "not given in this run"
    )
    values.update(
        loglog_exponent=loglog_exponent(),
        rate_exponent=-loglog_exponent(),
        half_interval_min=inputs.checkpoint_interval_min / 2.0,
        standby_gpu_hours=inputs.standby_gpus * HOURS_PER_WEEK,
        planned_loss_text=(
            "lose the same"
            if inputs.planned_loses_progress
            else "lose nothing (the baseline checkpoints just before a planned stop)"
        ),
        params_b=p.params / 1e9,
        replica=pt.replica_gpus(p),
        step_s=pt.step_time_s(p),
        step_source=derived,
        state_gb=pt.state_bytes_per_rank(p) / 1e9,
        transfer_s=pt.transfer_s(p),
        detect_s=pt.detection_s("unexpected", p),
        delta_us=pt.delta_phase2_s() * 1e6,
        build_ms=pt.group_build_fit().b * 1e3,
        full_ms=pt.full_rebuild_fit().b * 1e3,
        commit_1k_ms=pt.commit_s(1024, p) * 1e3,
        commit_128k_s=pt.commit_s(131072, p),
        commit_4096_ms=pt.commit_s(4096, p) * 1e3,
        commit_4096_measured_ms=pt.COMMIT_P50_MS_4096,
        first_step_s=pt.first_step_s(p),
        measured_text=measured,
        async_text=(
            " -- NOT in this run: async_commit, a what-if tmslurm does not implement, hides that wait"
            if p.async_commit
            else ""
        ),
    )
    return values


def assumptions(inputs: ProjectionInputs) -> list[str]:
    """:data:`ASSUMPTIONS` filled in with ``inputs``."""
    values = assumption_values(inputs)
    return [text.format(**values) for text in ASSUMPTIONS]


def gpus_label(gpus: int) -> str:
    """1024 -> '1K'; counts that are not multiples of 1,024 stay as they are."""
    return f"{gpus // 1024}K" if gpus % 1024 == 0 else str(gpus)
