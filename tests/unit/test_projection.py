"""benchmarks.sim.projection: the rate rule, the split, hand-checked waste, the tmslurm component
rows, the comparison with the paper, sensitivity, bad inputs, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.sim import parts as pt
from benchmarks.sim import projection as pj
from tmslurm.core.errors import ConfigError

INPUTS = pj.ProjectionInputs(tmslurm_planned_s=20.0, tmslurm_unexpected_s=30.0)


def _rows(result: dict, strategy: str) -> list[dict]:
    return [r for r in result["rows"] if r["strategy"] == strategy]


def test_mttf_matches_both_anchors_exactly() -> None:
    assert pj.mttf_hours(1024) == pytest.approx(7.9, rel=1e-12)
    assert pj.mttf_hours(16384) == pytest.approx(2.7, rel=1e-12)
    assert pj.mttf_hours(1024, "power_fit") == pytest.approx(7.9, rel=1e-12)
    assert pj.mttf_hours(16384, "power_fit") == pytest.approx(2.7, rel=1e-12)


def test_mttf_is_inverse_n_beyond_the_anchors() -> None:
    assert pj.mttf_hours(65536) == pytest.approx(2.7 / 4)
    assert pj.mttf_hours(131072) == pytest.approx(2.7 / 8)
    assert pj.mttf_hours(512) == pytest.approx(7.9 * 2)
    assert pj.mttf_hours(16384, "inverse_1k") == pytest.approx(7.9 / 16)


def test_mttf_loglog_between_anchors() -> None:
    b = math.log(2.7 / 7.9) / math.log(16)
    assert pj.mttf_hours(4096) == pytest.approx(7.9 * 4**b)
    assert 2.7 < pj.mttf_hours(8192) < 7.9


def test_planned_unexpected_split_is_1_to_8_9() -> None:
    total, planned, unexpected = pj.interruptions_per_week(1024, INPUTS)
    assert total == pytest.approx(168 / 7.9)
    assert unexpected / planned == pytest.approx(8.9)
    assert planned + unexpected == pytest.approx(total)


def test_monotonic_in_gpus() -> None:
    result = pj.project(INPUTS)
    for strategy in pj.STRATEGIES:
        rows = _rows(result, strategy)
        assert [r["gpus"] for r in rows] == list(pj.DEFAULT_GPUS)
        rates = [r["interruptions_per_week"] for r in rows]
        waste = [r["wasted_gpu_hours_per_week"] for r in rows]
        assert rates == sorted(rates) and len(set(rates)) == len(rates)
        assert waste == sorted(waste) and len(set(waste)) == len(waste)
    mttf = [pj.mttf_hours(n) for n in (256, 1024, 2048, 8192, 16384, 32768, 131072)]
    assert mttf == sorted(mttf, reverse=True)


def test_trainmover_downtime_interpolation_rule() -> None:
    assert pj.trainmover_downtime_s("planned", 32) == pytest.approx(11.5)
    assert pj.trainmover_downtime_s("planned", 1024) == pytest.approx(16.6)
    assert pj.trainmover_downtime_s("unexpected", 1024) == pytest.approx(21.0)
    assert pj.trainmover_downtime_s("planned", 2048) == pytest.approx(16.6 + 5.1 / 5)
    assert pj.trainmover_downtime_s("planned", 2048, "hold") == pytest.approx(16.6)
    assert pj.trainmover_downtime_s("unexpected", 8) == pytest.approx(19.6)


def test_restart_waste_by_hand_at_8k() -> None:
    mttf = 7.9 * (8192 / 1024) ** (math.log(2.7 / 7.9) / math.log(16))
    per_week = 168 / mttf
    planned, unexpected = per_week / 9.9, per_week * 8.9 / 9.9
    fixed_s = (0.52 + 1.50 + 1.56 + 1.09 + 1.80 + 2.0) * 60
    lost_s = 30 * 60 / 2
    expected = 8192 * (planned * fixed_s + unexpected * (fixed_s + lost_s)) / 3600
    row = next(r for r in pj.project(INPUTS)["rows"] if r["gpus"] == 8192 and r["strategy"] == "checkpoint_restart")
    assert row["wasted_gpu_hours_per_week"] == pytest.approx(expected)
    assert row["downtime_s_unexpected"] == pytest.approx(fixed_s + lost_s)
    assert row["reduction_vs_restart_pct"] == 0.0


def test_standby_counted_and_reduction_consistent() -> None:
    result = pj.project(INPUTS)
    tm = next(r for r in _rows(result, "tmslurm_measured") if r["gpus"] == 1024)
    base = next(r for r in _rows(result, "checkpoint_restart") if r["gpus"] == 1024)
    downtime_h = (tm["planned_per_week"] * 20 + tm["unexpected_per_week"] * 30) / 3600
    assert tm["wasted_gpu_hours_per_week"] == pytest.approx(1024 * downtime_h + 8 * 168)
    assert tm["reduction_vs_restart_pct"] == pytest.approx(
        100 * (1 - tm["wasted_gpu_hours_per_week"] / base["wasted_gpu_hours_per_week"])
    )


def test_result_shape_claims_and_assumptions() -> None:
    result = pj.project(INPUTS)
    json.dumps(result)
    keys = {
        "gpus",
        "strategy",
        "interruptions_per_week",
        "planned_per_week",
        "unexpected_per_week",
        "downtime_s_planned",
        "downtime_s_unexpected",
        "wasted_gpu_hours_per_week",
        "reduction_vs_restart_pct",
    }
    assert all(keys <= set(r) for r in result["rows"])
    assert len(result["assumptions"]) == len(pj.ASSUMPTIONS)
    assert any("30 min" in a for a in result["assumptions"])
    assert {type(c["agrees"]) for c in result["claims"]} == {bool}
    assert any("64K" in c["claim"] for c in result["claims"])
    assert any("1K" in c["claim"] for c in result["claims"])
    text = pj.format_table(result)
    assert "Assumptions" in text and "128K" in text


@pytest.mark.parametrize(
    "field,value",
    [
        ("tmslurm_planned_s", -1.0),
        ("tmslurm_unexpected_s", "x"),
        ("checkpoint_interval_min", float("nan")),
        ("gpus", (0,)),
        ("mttf_rule", "linear"),
        ("trainmover_beyond", "grow"),
    ],
)
def test_bad_inputs_name_the_field(field: str, value) -> None:
    kwargs = {"tmslurm_planned_s": 1.0, "tmslurm_unexpected_s": 1.0, field: value}
    with pytest.raises(ConfigError, match=field if field != "gpus" else "gpus"):
        pj.ProjectionInputs(**kwargs)


def test_cli_writes_json(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "a" / "b" / "projection.json"
    assert pj.main(["--planned-s", "20", "--unexpected-s", "30", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 5 * len(pj.STRATEGIES) and data["assumptions"] and data["claims"]
    assert {r["strategy"] for r in data["rows"]} == set(pj.STRATEGIES)
    assert "checkpoint_restart" in capsys.readouterr().out


def test_cli_reads_downtime_json(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    bench = tmp_path / "downtime.json"
    bench.write_text(
        json.dumps(
            {
                "medians": {"tmslurm_planned_median_s": 4.0},
                "rows": [{"event": "unexpected", "strategy": "tmslurm", "downtime_s": s} for s in (5.0, 6.0, 9.0)],
            }
        )
    )
    inputs, _ = pj.parse_inputs(["--downtime-json", str(bench)])
    assert (inputs.tmslurm_planned_s, inputs.tmslurm_unexpected_s) == (4.0, 6.0)
    assert str(bench) in inputs.tmslurm_source


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--planned-s", "-3", "--unexpected-s", "1"], "--planned-s"),
        (["--planned-s", "1", "--unexpected-s", "abc"], "--unexpected-s"),
        (["--planned-s", "1"], "--unexpected-s"),
        (["--downtime-json", "missing.json"], "--downtime-json"),
        (["--planned-s", "1", "--unexpected-s", "1", "--gpus", "1024,x"], "--gpus"),
        (["--planned-s", "1", "--unexpected-s", "1", "--checkpoint-interval-min", "-5"], "--checkpoint-interval-min"),
        (["--params", "0"], "--params"),
        (["--bytes-per-param", "-14"], "--bytes-per-param"),
        (["--tp", "0"], "--tp"),
        (["--pp", "2.5"], "--pp"),
        (["--gpus-per-node", "x"], "--gpus-per-node"),
        (["--link-gbps", "inf"], "--link-gbps"),
        (["--tokens-per-replica", "0"], "--tokens-per-replica"),
        (["--achieved-tflops", "-1"], "--achieved-tflops"),
        (["--flops-per-param-token", "nan"], "--flops-per-param-token"),
        (["--step-s", "0"], "--step-s"),
        (["--first-step-steps", "-1"], "--first-step-steps"),
        (["--node-timeout-s", "soon"], "--node-timeout-s"),
        (["--detect-tick-s", "-0.05"], "--detect-tick-s"),
        (["--heartbeat-interval-s", "0"], "--heartbeat-interval-s"),
        (["--monitor-interval-s", "0"], "--monitor-interval-s"),
        (["--control-law", "cubic"], "--control-law"),
        (["--gpus", "1000"], "--gpus"),
        (["--tp", "3", "--gpus", "1024"], "--gpus"),
        (["--standby-gpus", "1.5"], "--standby-gpus"),
        (["--unexpected-per-planned", "0"], "--unexpected-per-planned"),
        (["--restart-fixed-min", "-1"], "--restart-fixed-min"),
        (["--reschedule-extra-min", "x"], "--reschedule-extra-min"),
    ],
)
def test_cli_bad_inputs_name_the_flag(argv, flag, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert pj.main(argv + ["--out", str(tmp_path / "p.json")]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_corrupt_downtime_json_names_file(tmp_path: Path) -> None:
    bad = tmp_path / "downtime.json"
    bad.write_text("{oops")
    with pytest.raises(ConfigError, match="downtime.json"):
        pj.read_measured_downtimes(bad)
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ConfigError, match="tmslurm_planned_median_s"):
        pj.read_measured_downtimes(bad)


DEFAULT = pj.ProjectionInputs()


def _row(result: dict, strategy: str, gpus: int) -> dict:
    return next(r for r in result["rows"] if r["strategy"] == strategy and r["gpus"] == gpus)


def test_default_tmslurm_rows_are_the_component_model() -> None:
    result = pj.project(DEFAULT)
    assert {r["strategy"] for r in result["rows"]} == set(pj.STRATEGIES) - {"tmslurm_measured"}
    for gpus in pj.DEFAULT_GPUS:
        for strategy, mode in (("tmslurm", "delta"), ("tmslurm_full_rebuild", "full")):
            row = _row(result, strategy, gpus)
            for kind in pt.KINDS:
                parts = pt.downtime_parts(kind, gpus, DEFAULT.parts, mode)
                assert row[f"parts_{kind}"] == parts
                assert row[f"downtime_s_{kind}"] == pytest.approx(sum(parts.values()))
    assert [s["gpus"] for s in result["scale"]] == list(pj.DEFAULT_GPUS)
    json.dumps(result)


@pytest.mark.parametrize("gpus", [1024, 16384, 131072])
def test_tmslurm_waste_by_hand(gpus: int) -> None:
    total, planned, unexpected = pj.interruptions_per_week(gpus, DEFAULT)
    d_p = pt.downtime_s("planned", gpus, DEFAULT.parts)
    d_u = pt.downtime_s("unexpected", gpus, DEFAULT.parts)
    downtime_h = (planned * d_p + unexpected * d_u) / 3600
    c = pt.commit_s(gpus, DEFAULT.parts)
    step = pt.step_time_s(DEFAULT.parts)
    control = gpus * (168 - downtime_h) * c / (step + c)
    row = _row(pj.project(DEFAULT), "tmslurm", gpus)
    assert row["downtime_gpu_hours_per_week"] == pytest.approx(gpus * downtime_h)
    assert row["control_gpu_hours_per_week"] == pytest.approx(control)
    assert row["wasted_gpu_hours_per_week"] == pytest.approx(gpus * downtime_h + control + 8 * 168)
    for strategy in ("checkpoint_restart", "trainmover_paper"):
        assert _row(pj.project(DEFAULT), strategy, gpus)["control_gpu_hours_per_week"] == 0.0


def test_comparison_with_the_paper_at_1k_16k_64k_128k() -> None:
    comparison = pj.project(DEFAULT)["comparison"]
    assert [c["gpus"] for c in comparison] == [1024, 16384, 65536, 131072]
    assert comparison[0]["paper_source"] == "measured"
    assert (comparison[0]["paper_planned_s"], comparison[0]["paper_unexpected_s"]) == (16.6, 21.0)
    for c in comparison:
        for kind in pt.KINDS:
            assert c[f"paper_{kind}_s"] == pj.trainmover_downtime_s(kind, c["gpus"])
            assert c[f"tmslurm_{kind}_s"] == pytest.approx(pt.downtime_s(kind, c["gpus"], DEFAULT.parts))
            assert c[f"ratio_{kind}"] == pytest.approx(c[f"tmslurm_{kind}_s"] / c[f"paper_{kind}_s"])
            assert "largest parts" in c[f"note_{kind}"]


def test_tmslurm_sensitivity_moves_the_right_way() -> None:
    rows = {s["variant"]: s for s in pj.project(DEFAULT)["tmslurm_sensitivity"]}
    base = rows["as given"]
    assert rows["link x0.25 (100 Gb/s)"]["planned_1k_s"] > base["planned_1k_s"]
    assert rows["link x4 (1600 Gb/s)"]["planned_1k_s"] < base["planned_1k_s"]
    assert rows["node_timeout_s=3 (no node monitors)"]["unexpected_1k_s"] == pytest.approx(
        base["unexpected_1k_s"] + 2.2
    )
    assert rows["node_timeout_s=3 (no node monitors)"]["planned_1k_s"] == base["planned_1k_s"]
    by_law = {law: rows.get(f"control_law={law}", base) for law in pt.CONTROL_LAWS}
    for gpus, key in ((131072, "planned_128k_s"), (65536, "control_overhead_64k_pct")):
        order = sorted(pt.CONTROL_LAWS, key=lambda law: pt.commit_s(gpus, pt.PartInputs(control_law=law)))
        assert [by_law[law][key] for law in order] == sorted(by_law[law][key] for law in order)
    assert by_law["hold"]["planned_128k_s"] == min(r["planned_128k_s"] for r in by_law.values())
    assert rows["first_step_steps=0 (pause only)"]["planned_1k_s"] == pytest.approx(
        base["planned_1k_s"] - pt.step_time_s(DEFAULT.parts)
    )
    assert {"model 70B, TP8 x PP4", "model 405B, TP8 x PP16"} <= set(rows)
    hidden = rows["async_commit (what-if)"]
    assert hidden["control_overhead_64k_pct"] == 0.0
    assert hidden["planned_1k_s"] == base["planned_1k_s"]


def test_cli_flags_reach_the_component_model(tmp_path: Path) -> None:
    inputs, _ = pj.parse_inputs(
        [
            "--link-gbps",
            "100",
            "--node-timeout-s",
            "3",
            "--params",
            "70e9",
            "--pp",
            "4",
            "--step-s",
            "2",
            "--control-law",
            "hold",
            "--gpus",
            "1024,2048",
            "--out",
            str(tmp_path / "p.json"),
        ]
    )
    p = inputs.parts
    assert (p.link_gbps, p.node_timeout_s, p.params, p.pp, p.step_s, p.control_law) == (
        100.0,
        3.0,
        70e9,
        4,
        2.0,
        "hold",
    )
    assert pt.transfer_s(p) == pytest.approx(70e9 * 14 / 32 / 12.5e9)
    assert inputs.gpus == (1024, 2048) and not inputs.measured
    defaults, _ = pj.parse_inputs([])
    assert defaults.parts == pt.PartInputs() and defaults.standby_gpus == 8


def test_default_cli_has_no_constant_rows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "p.json"
    assert pj.main(["--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "tmslurm_measured" not in {r["strategy"] for r in data["rows"]}
    assert data["inputs"]["parts"]["derived_step_s"] == pytest.approx(pt.step_time_s(pt.PartInputs()))


def test_constant_downtimes_need_both() -> None:
    with pytest.raises(ConfigError, match="tmslurm_planned_s"):
        pj.ProjectionInputs(tmslurm_planned_s=1.0)
    with pytest.raises(ConfigError, match="gpus: 1000"):
        pj.ProjectionInputs(gpus=(1000,))
