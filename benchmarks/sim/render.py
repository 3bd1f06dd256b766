"""Plain-text rendering of a projection result (:func:`benchmarks.sim.projection.project`).

Contract: :func:`format_table` takes the JSON-able result dict and returns text: the wasted
GPU-hours per strategy, tmslurm's downtime parts per N, the per-N transfer and control-plane
figures, the comparison with the paper, the claims, both sensitivity tables and the assumptions.
It reads only keys :func:`~benchmarks.sim.projection.project` writes; it never raises for a result
that function produced.
"""

from __future__ import annotations

from benchmarks.sim import parts as pt
from benchmarks.sim.model import gpus_label

PART_HEAD = "".join(f"{name[:-2]:>12}" for name in pt.PART_NAMES)


def _waste(result: dict) -> list[str]:
    head = (
        f"{'GPUs':>5} {'strategy':<20} {'MTTF h':>7} {'int/wk':>7} {'d_plan s':>9} "
        f"{'d_unex s':>9} {'downtime GPU-h':>15} {'control GPU-h':>14} "
        f"{'wasted GPU-h/wk':>16} {'vs restart':>10}"
    )
    lines = ["Wasted GPU-hours per week (standby included)", head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(
            f"{gpus_label(r['gpus']):>5} {r['strategy']:<20} {r['mttf_h']:7.2f} "
            f"{r['interruptions_per_week']:7.1f} {r['downtime_s_planned']:9.1f} "
            f"{r['downtime_s_unexpected']:9.1f} {r['downtime_gpu_hours_per_week']:15,.0f} "
            f"{r['control_gpu_hours_per_week']:14,.0f} {r['wasted_gpu_hours_per_week']:16,.0f} "
            f"{r['reduction_vs_restart_pct']:9.1f}%"
        )
    return lines


def _parts(result: dict) -> list[str]:
    head = f"{'GPUs':>5} {'event':<11}{PART_HEAD}{'total':>12}"
    lines = ["", "tmslurm downtime per part, seconds (component model, delta switch)", head, "-" * len(head)]
    for r in result["rows"]:
        if r["strategy"] != "tmslurm":
            continue
        for kind in pt.KINDS:
            parts = r[f"parts_{kind}"]
            cells = "".join(f"{parts[name]:12.3f}" for name in pt.PART_NAMES)
            lines.append(f"{gpus_label(r['gpus']):>5} {kind:<11}{cells}{sum(parts.values()):12.3f}")
    return lines


def _scale(result: dict) -> list[str]:
    head = (
        f"{'GPUs':>5} {'DP':>5} {'members':>7} {'GB/rank':>8} {'link GB/s':>9} "
        f"{'transfer s':>10} {'step s':>7} {'commit ms':>11} {'ctl CPU s/step':>14} "
        f"{'overhead':>9} {'heartbeats/s':>12} {'full rebuild s':>14}"
    )
    lines = [
        "",
        "Transfer and control plane per N (commit and CPU: single-controller fit, extrapolated beyond 1,024 ranks: *)",
        head,
        "-" * len(head),
    ]
    for s in result["scale"]:
        star = "*" if s["extrapolated"] else " "
        lines.append(
            f"{gpus_label(s['gpus']):>5} {s['dp']:5d} {s['affected_group_size']:7d} "
            f"{s['state_gb_per_rank']:8.2f} {s['link_gb_per_s']:9.1f} {s['transfer_s']:10.3f} "
            f"{s['step_s']:7.2f} {s['commit_ms']:10,.1f}{star} "
            f"{s['controller_cpu_s_per_step']:13,.3f}{star} {s['control_overhead_pct']:8.2f}% "
            f"{s['heartbeats_per_s']:12,.0f} {s['full_rebuild_s']:14,.1f}"
        )
    return lines


def _comparison(result: dict) -> list[str]:
    lines = ["", "tmslurm (component model) vs the TrainMover paper's downtimes, seconds"]
    for c in result["comparison"]:
        lines.append(
            f"  {gpus_label(c['gpus']):>4} (paper {c['paper_source']}): planned "
            f"{c['tmslurm_planned_s']:,.1f} vs {c['paper_planned_s']:.1f} "
            f"(x{c['ratio_planned']:.2f}), unexpected {c['tmslurm_unexpected_s']:,.1f} vs "
            f"{c['paper_unexpected_s']:.1f} (x{c['ratio_unexpected']:.2f})"
        )
        for kind in pt.KINDS:
            lines.append(f"         {kind}: {c[f'note_{kind}']}")
    return lines


def _claims(result: dict) -> list[str]:
    lines = ["", "Paper claims vs this model"]
    for c in result["claims"]:
        lines.append(
            f"  [{'agrees' if c['agrees'] else 'DISAGREES'}] {c['claim']}: "
            f"paper {c['paper']}; ours {c['ours']}. {c['note']}"
        )
    return lines


def _sensitivity(result: dict) -> list[str]:
    lines = ["", "Sensitivity (TrainMover paper vs checkpoint restart)"]
    for s in result["sensitivity"]:
        lines.append(
            f"  {s['variant']:<46} MTTF 16K {s['mttf_h_16k']:5.2f} h, 64K "
            f"{s['mttf_h_64k']:5.2f} h; 64K: {s['reduction_64k_pct']:5.1f}% less, "
            f"{s['saving_64k_gpu_h'] / 1e6:5.2f}M GPU-h/wk saved; standby worth it "
            f"at 1K: {'yes' if s['standby_worth_it_1k'] else 'no'}"
        )
    head = (
        f"  {'variant':<36} {'1K plan/unex s':>16} {'128K plan/unex s':>18} "
        f"{'64K overhead':>12} {'64K vs restart':>14} {'64K / TrainMover':>16}  beats TM at"
    )
    lines += ["", "Sensitivity (tmslurm component model)", head]
    for s in result["tmslurm_sensitivity"]:
        lines.append(
            f"  {s['variant']:<36} {s['planned_1k_s']:7.2f}/{s['unexpected_1k_s']:<8.2f} "
            f"{s['planned_128k_s']:8.1f}/{s['unexpected_128k_s']:<9.1f} "
            f"{s['control_overhead_64k_pct']:11.1f}% {s['reduction_64k_pct']:13.1f}% "
            f"{s['waste_vs_trainmover_64k']:15.2f}x  {', '.join(s['beats_trainmover_at']) or '-'}"
        )
    return lines


def format_table(result: dict) -> str:
    """Plain-text rendering of the projection result."""
    lines = (
        _waste(result) + _parts(result) + _scale(result) + _comparison(result) + _claims(result) + _sensitivity(result)
    )
    lines += ["", "Assumptions"] + [f"  {i}. {a}" for i, a in enumerate(result["assumptions"], 1)]
    return "\n".join(lines)
