"""Projected wasted GPU-hours per week at scale: checkpoint restart vs TrainMover vs tmslurm.

Contract: :func:`project` is a pure function of a :class:`ProjectionInputs`; it returns a
JSON-able dict with ``assumptions`` (every modelling choice, as sentences), ``inputs``, ``rows``
(one per GPU count and strategy; tmslurm rows carry their downtime ``parts_planned`` and
``parts_unexpected``), ``scale`` (per GPU count: layout, state transfer and control-plane
figures), ``comparison`` (tmslurm vs the paper's downtimes at 1K/16K/64K/128K), ``claims`` (the
paper's claims checked against this model), ``sensitivity`` (how those verdicts move) and
``tmslurm_sensitivity`` (how tmslurm's downtimes and verdicts move with each input of its
component model). :func:`~benchmarks.sim.render.format_table` renders it; :func:`main` is the
command line::

    python -m benchmarks.sim.projection [--params 175e9 --tp 8 --pp 8 --link-gbps 400 ...]
                                     [--downtime-json PATH | --planned-s X --unexpected-s Y]
                                     [--out docs/bench/projection.json]

tmslurm's default row is the component model of :mod:`benchmarks.sim.parts` (one law per downtime
part); the model of rates and strategies is :mod:`benchmarks.sim.model`. Measured downtimes held
constant at every N (the earlier mode) are an extra ``tmslurm_measured`` row, only when
``--downtime-json`` or ``--planned-s``/``--unexpected-s`` are given.

Failure behaviour: invalid inputs raise :class:`~tmslurm.core.errors.ConfigError` naming the field
(from the API) or the flag (from the command line); an explicitly named downtime file that is
missing, unreadable or lacks the tmslurm medians raises ``ConfigError`` naming the file and flag.
:func:`main` prints the message and returns 2; it never raises for bad user input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.sim import parts as pt
from benchmarks.sim.model import (  # noqa: F401
    ASSUMPTIONS,
    BEYOND_RULES,
    DEFAULT_GPUS,
    HOURS_PER_WEEK,
    MTTF_ANCHORS,
    MTTF_RULES,
    RESTART_BREAKDOWN_MIN,
    STRATEGIES,
    TRAINMOVER_DOWNTIME_S,
    ProjectionInputs,
    assumptions,
    interruptions_per_week,
    loglog_exponent,
    mttf_hours,
    reduction_pct,
    restart_downtime_s,
    rows_at,
    strategy_downtimes_s,
    trainmover_downtime_s,
    wasted_gpu_hours,
)
from benchmarks.sim.render import format_table  # noqa: F401
from benchmarks.sim.verdicts import check_claims, compare_with_paper, sensitivity, tmslurm_sensitivity
from tmslurm.core.errors import ConfigError
from tmslurm.core.jsonfile import read_json_object

DEFAULT_OUT = Path("docs/bench/projection.json")


def project(inputs: ProjectionInputs) -> dict:
    """Run the model; returns the JSON-able result described in the module docstring."""
    inputs_json = dataclasses.asdict(inputs)
    inputs_json["parts"]["derived_step_s"] = pt.step_time_s(inputs.parts)
    return {
        "assumptions": assumptions(inputs),
        "inputs": inputs_json,
        "rows": [row for gpus in inputs.gpus for row in rows_at(gpus, inputs)],
        "scale": [pt.scale_row(gpus, inputs.parts) for gpus in inputs.gpus],
        "comparison": compare_with_paper(inputs),
        "claims": check_claims(inputs),
        "sensitivity": sensitivity(inputs),
        "tmslurm_sensitivity": tmslurm_sensitivity(inputs),
    }


# ---------------------------------------------------------------- measured downtimes


def read_measured_downtimes(path: Path, flag: str = "--downtime-json") -> tuple[float, float]:
    """tmslurm's (planned, unexpected) median downtimes from a downtime.json, seconds.

    Looks for ``tmslurm_<kind>_median_s`` at the top level or under ``medians`` (flat or nested
    ``medians[tmslurm][kind]``), else takes the median of the tmslurm rows. Raises ConfigError
    naming ``path`` and ``flag`` when the file is missing, corrupt or holds neither.
    """
    data = read_json_object(Path(path), f"the file given to {flag}", ConfigError)
    return _measured(data, "planned", path, flag), _measured(data, "unexpected", path, flag)


def _measured(data: dict, kind: str, path: Path, flag: str) -> float:
    key = f"tmslurm_{kind}_median_s"
    medians = data.get("medians")
    if not isinstance(medians, dict):
        medians = {}
    nested = medians.get("tmslurm")
    if not isinstance(nested, dict):
        nested = {}
    for value in (data.get(key), medians.get(key), nested.get(kind)):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return pt.check_number(f"{flag} {path}: {key}", float(value))
    found = [
        r.get("downtime_s")
        for r in data.get("rows") or []
        if isinstance(r, dict) and r.get("strategy") == "tmslurm" and r.get("event") == kind
    ]
    rows = [float(x) for x in found if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if rows:
        return statistics.median(rows)
    raise ConfigError(
        f"{flag} {path}: no '{key}' (top level or under 'medians') and no tmslurm/{kind} rows with downtime_s"
    )


# ---------------------------------------------------------------- command line

_PART_DEFAULTS = pt.PartInputs()
#: (flag, PartInputs field, check): every input of the component model has a flag.
PART_FLAGS = (
    ("--params", "params", "positive", "model parameters"),
    ("--bytes-per-param", "bytes_per_param", "positive", "state bytes per parameter"),
    ("--tp", "tp", "int", "tensor-parallel degree"),
    ("--pp", "pp", "int", "pipeline-parallel degree"),
    ("--gpus-per-node", "gpus_per_node", "int", "GPUs per machine"),
    ("--link-gbps", "link_gbps", "positive", "inter-node bandwidth per GPU, Gbit/s"),
    ("--tokens-per-replica", "tokens_per_replica", "positive", "tokens per step per DP replica"),
    ("--achieved-tflops", "achieved_tflops", "positive", "achieved TFLOP/s per GPU"),
    ("--flops-per-param-token", "flops_per_param_token", "positive", "training FLOPs per parameter per token"),
    ("--step-s", "step_s", "positive", "step time, s (default: derived from the job)"),
    ("--first-step-steps", "first_step_steps", "number", "steps counted as the first step"),
    ("--node-timeout-s", "node_timeout_s", "number", "detect.node_timeout_s"),
    ("--detect-tick-s", "detect_tick_s", "number", "the controller's deadline tick, s"),
    ("--heartbeat-interval-s", "heartbeat_interval_s", "positive", "detect.heartbeat_interval_s"),
    ("--monitor-interval-s", "monitor_interval_s", "positive", "detect.monitor_interval_s"),
)
#: (flag, ProjectionInputs field, check, help) for the rate and restart model.
MODEL_FLAGS = (
    ("--checkpoint-interval-min", "checkpoint_interval_min", "number", "restart baseline checkpoint interval, minutes"),
    ("--restart-fixed-min", "restart_fixed_min", "number", "fixed restart cost, minutes"),
    ("--reschedule-extra-min", "reschedule_extra_min", "number", "extra rescheduling per restart, minutes"),
    ("--unexpected-per-planned", "unexpected_per_planned", "positive", "unexpected interruptions per planned one"),
    ("--standby-gpus", "standby_gpus", "int0", "idle standby GPUs"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sim.projection", description="Project wasted GPU-hours per week at scale."
    )
    p.add_argument(
        "--downtime-json", metavar="PATH", help="measured downtimes held constant: adds tmslurm_measured rows"
    )
    p.add_argument("--planned-s", metavar="X", help="constant planned downtime, s (overrides file)")
    p.add_argument("--unexpected-s", metavar="Y", help="constant unexpected downtime, s (overrides file)")
    model_defaults = ProjectionInputs()
    for flag, name, _, text in MODEL_FLAGS:
        default = getattr(model_defaults, name)
        p.add_argument(flag, metavar="X", default=str(default), help=f"{text} (default {default})")
    p.add_argument("--gpus", metavar="N,N,...", default=",".join(map(str, DEFAULT_GPUS)))
    p.add_argument("--mttf-rule", choices=MTTF_RULES, default="loglog")
    p.add_argument("--trainmover-beyond", choices=BEYOND_RULES, default="extrapolate")
    p.add_argument("--planned-loses-progress", action="store_true")
    for flag, name, _, text in PART_FLAGS:
        default = getattr(_PART_DEFAULTS, name)
        p.add_argument(
            flag, metavar="X", default=None if default is None else f"{default:g}", help=f"{text} (default {default})"
        )
    p.add_argument(
        "--control-law",
        metavar="LAW",
        default=_PART_DEFAULTS.control_law,
        help=f"commit/control growth beyond 1,024 ranks: {', '.join(pt.CONTROL_LAWS)}",
    )
    p.add_argument(
        "--async-commit", action="store_true", help="what-if, not implemented: steps do not wait for their commit"
    )
    p.add_argument("--out", metavar="PATH", default=str(DEFAULT_OUT), help=f"JSON output (default {DEFAULT_OUT})")
    return p


def _value(flag: str, text: str | None, check: str) -> float | int | None:
    """Parse ``text`` for ``flag``; ConfigError naming the flag when it is not a valid value."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag} must be a number, got {text!r}") from None
    if check in ("int", "int0"):
        if not math.isfinite(value) or value != int(value) or value < (check == "int"):
            what = "a positive whole number" if check == "int" else "a whole number >= 0"
            raise ConfigError(f"{flag} must be {what}, got {text!r}")
        return int(value)
    try:
        return (pt.check_positive if check == "positive" else pt.check_number)(flag, value)
    except ConfigError:
        sign = "> 0" if check == "positive" else ">= 0"
        raise ConfigError(f"{flag} must be a finite number {sign}, got {text!r}") from None


def _gpus_flag(text: str, replica: int) -> tuple[int, ...]:
    try:
        gpus = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--gpus must be comma-separated integers, got {text!r}") from None
    if not gpus or min(gpus) <= 0:
        raise ConfigError(f"--gpus must list positive integers, got {text!r}")
    bad = [g for g in gpus if g % replica]
    if bad:
        raise ConfigError(f"--gpus {bad[0]} is not a multiple of --tp x --pp = {replica}")
    return gpus


def _tmslurm_downtimes(args: argparse.Namespace) -> tuple[float | None, float | None, str]:
    planned = _value("--planned-s", args.planned_s, "number")
    unexpected = _value("--unexpected-s", args.unexpected_s, "number")
    path = Path(args.downtime_json) if args.downtime_json else None
    if planned is not None and unexpected is not None:
        return planned, unexpected, "command line" + (f", overriding {path}" if path else "")
    if path is None:
        if planned is None and unexpected is None:
            return None, None, "not given"
        missing = "--unexpected-s" if unexpected is None else "--planned-s"
        raise ConfigError(
            f"{missing} is missing: constant downtimes need --planned-s and --unexpected-s together, or --downtime-json"
        )
    file_planned, file_unexpected = read_measured_downtimes(path)
    source = f"medians from {path}" + (
        " with a command-line override" if planned is not None or unexpected is not None else ""
    )
    return (file_planned if planned is None else planned, file_unexpected if unexpected is None else unexpected, source)


def parse_inputs(argv: Sequence[str] | None = None) -> tuple[ProjectionInputs, Path]:
    """Command line -> (inputs, JSON output path); ConfigError names the offending flag."""
    args = _parser().parse_args(argv)
    planned, unexpected, source = _tmslurm_downtimes(args)
    part_values = {name: _value(flag, getattr(args, name), check) for flag, name, check, _ in PART_FLAGS}
    if args.control_law not in pt.CONTROL_LAWS:
        raise ConfigError(f"--control-law must be one of {', '.join(pt.CONTROL_LAWS)}; got {args.control_law!r}")
    parts = pt.PartInputs(
        # _value's check per flag gives each field its declared type; mypy sees one union for the mixed fields
        **{k: v for k, v in part_values.items() if v is not None},  # type: ignore[arg-type]
        control_law=args.control_law,
        async_commit=args.async_commit,
    )
    model_values = {name: _value(flag, getattr(args, name), check) for flag, name, check, _ in MODEL_FLAGS}
    inputs = ProjectionInputs(
        tmslurm_planned_s=planned,
        tmslurm_unexpected_s=unexpected,
        tmslurm_source=source,
        parts=parts,
        gpus=_gpus_flag(args.gpus, pt.replica_gpus(parts)),
        mttf_rule=args.mttf_rule,
        trainmover_beyond=args.trainmover_beyond,
        planned_loses_progress=args.planned_loses_progress,
        # every model flag has a default, so no value is None; mypy sees one union for the mixed fields
        **model_values,  # type: ignore[arg-type]
    )
    return inputs, Path(args.out)


def write_json(result: dict, out: Path) -> Path:
    """Write ``result`` to ``out`` (parent folders created); returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the tables, write the JSON; returns 0, or 2 with a message on bad input."""
    try:
        inputs, out = parse_inputs(argv)
        result = project(inputs)
        print(format_table(result))
        write_json(result, out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write --out: {exc}", file=sys.stderr)
        return 2
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
