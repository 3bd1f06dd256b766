"""benchmarks.statesize's pure parts: the source's RSS around an event, a row's p50s and floor,
and the progress lines of its loop over cells."""

from __future__ import annotations

import pytest

from benchmarks.statesize import row, source_rss, table


def _ev(pause: float, down: float, **more) -> dict:
    return {"pause_s": pause, "downtime_s": down, "transfer_s": 0.0, "first_step_s": 0.1, "gap_s": pause + 0.1, **more}


def test_source_rss_reads_the_sources_peak_before_and_after_the_event():
    summary = {
        "step_log": [
            {"t_end": 1.0, "peak_rss_mb": {"0": 100.0, "3": 200.0}},
            {"t_end": 2.0, "peak_rss_mb": {}},
            {"t_end": 3.0, "peak_rss_mb": {"3": 204.0}},
        ]
    }
    assert source_rss(summary, {"sources": [3], "last_commit_t": 2.0}) == {"before_mb": 200.0, "after_mb": 204.0}
    assert source_rss(summary, {"sources": [0], "last_commit_t": 2.0}) == {"before_mb": 100.0, "after_mb": 100.0}
    assert source_rss(summary, {"sources": []}) == {"before_mb": None, "after_mb": None}


def test_row_takes_p50s_per_cell_and_the_floor_from_the_link():
    shadow = [_ev(0.05, 0.01, shadowed=True, shadow_matched=True, shadow_catchup_s=c) for c in (1.0, 2.0, 3.0)]
    plain = [_ev(p, p - 0.04) for p in (0.5, 0.7, 0.6)]
    kill = [
        _ev(
            1.2,
            1.1,
            detect_s=0.9,
            pick_s=b / 10,
            before_fault_s=b,
            pause_from_fault_s=1.2 - b,
            source_rss={"before_mb": 500.0, "after_mb": 510.0},
        )
        for b in (0.4, 0.5, 0.6)
    ]
    overlap = [_ev(p, p, pause_from_fault_s=p - 0.5, transfer_s=1.0) for p in (2.0, 1.9, 2.1)]
    restart = [_ev(9.0, 9.5), _ev(11.0, 10.5), _ev(10.0, 10.0)]
    summary = {
        "state_bytes": {"0": 1_000_000_000, "1": 900_000_000},
        "memory": {"standby_rss_mb": 1200.0, "largest_rank_peak_rss_mb": 1400.0},
    }
    cells = {
        "shadow": {"summary": summary, "events": shadow},
        "noshadow": {"summary": summary, "events": plain},
        "unexpected": {"summary": summary, "events": kill},
        "unexpected_overlap": {"summary": summary, "events": overlap},
        "injob_restart": {"summary": summary, "events": restart},
    }
    r = row("large", {"link_gbps": 2.0, "transfer_gbps": 1.6}, cells)
    assert (r["state_mb_per_rank"], r["floor_s"]) == (1000.0, 0.5)
    assert (r["planned_shadow_pause_p50_s"], r["planned_pause_p50_s"], r["unexpected_pause_p50_s"]) == (0.05, 0.6, 1.2)
    assert r["injob_restart_planned_downtime_p50_s"] == 10.0 and r["shadow_catchup_p50_s"] == 2.0
    assert r["all_shadowed"] is True
    assert r["n"] == {"shadow": 3, "noshadow": 3, "unexpected": 3, "unexpected_overlap": 3, "injob_restart": 3}
    assert (
        r["unexpected_overlap_pause_p50_s"],
        r["unexpected_overlap_pause_from_fault_p50_s"],
        r["unexpected_overlap_transfer_p50_s"],
    ) == (2.0, 1.5, 1.0)
    assert (r["unexpected_gap_p50_s"], r["unexpected_overlap_gap_p50_s"], r["unexpected_overlap_downtime_p50_s"]) == (
        1.3,
        2.1,
        2.0,
    )
    assert r["unexpected_downtime_from_fault_p50_s"] == pytest.approx(0.6)  # 1.1 - 0.5
    assert r["unexpected_overlap_downtime_from_fault_p50_s"] is None  # no before_fault_s
    assert (r["source_peak_rss_before_mb"], r["source_peak_rss_during_mb"]) == (500.0, 510.0)
    assert (r["unexpected_before_fault_p50_s"], r["unexpected_pause_from_fault_p50_s"]) == (0.5, 0.7)
    assert (
        r["samples"]["unexpected"][0]["before_fault_s"] == 0.4 and "before_fault_s" not in r["samples"]["noshadow"][0]
    )
    assert r["unexpected_pick_p50_s"] == 0.05 and r["samples"]["unexpected"][2]["pick_s"] == 0.06
    assert r["unexpected_bound_s"] == 0.9 + 1.5 * 0.5 + 0.1  # detection p50 + 1.5 x floor + 0.1 s
    assert len(r["samples"]["noshadow"]) == 3 and "large" in table([r])


def test_a_row_of_one_cell_leaves_the_others_null():
    summary = {"state_bytes": {"0": 500_000_000}, "memory": {}}
    kill = [_ev(1.2, 1.1, before_fault_s=0.5, pause_from_fault_s=0.7, source_rss={"before_mb": None, "after_mb": None})]
    r = row("base", {"link_gbps": 2.0, "transfer_gbps": 1.6}, {"unexpected": {"summary": summary, "events": kill}})
    assert r["unexpected_pause_from_fault_p50_s"] == 0.7 and r["n"] == {"unexpected": 1}
    assert (r["planned_shadow_pause_p50_s"], r["injob_restart_planned_downtime_p50_s"], r["all_shadowed"]) == (
        None,
        None,
        None,
    )
    assert r["unexpected_bound_s"] is None  # no detection figure: no bound
    assert "base" in table([r])


@pytest.mark.parametrize("cells", ["", "shadow,kill"])
def test_unknown_cells_are_refused_before_anything_runs(tmp_path, cells):
    from argparse import Namespace

    from benchmarks import statesize
    from tmslurm.core.errors import TmslurmError

    with pytest.raises(TmslurmError, match="--cells"):
        statesize.main(
            Namespace(
                out=str(tmp_path), models="small", repeats=1, link_repeats=1, json=str(tmp_path / "s.json"), cells=cells
            )
        )


def test_main_reports_progress_after_the_link_and_each_cell(monkeypatch, capsys, tmp_path):
    from argparse import Namespace

    from benchmarks import statesize

    calls = []
    monkeypatch.setattr(statesize.linkbw, "measure", lambda model, n: None)
    monkeypatch.setattr(statesize.linkbw, "row", lambda model, m: {})
    monkeypatch.setattr(
        statesize, "cell", lambda out, model, name, n: calls.append((model, name)) or {"events": [{}] * n}
    )
    monkeypatch.setattr(statesize, "row", lambda model, link, cells: {"model": model})
    monkeypatch.setattr(statesize, "table", lambda rows: "")
    monkeypatch.setattr(statesize, "write_json", lambda path, data: None)
    monkeypatch.setattr(statesize, "plot", lambda rows, path: None)
    monkeypatch.setattr(statesize, "_result", lambda rows, done: {})
    statesize.main(
        Namespace(
            out=str(tmp_path),
            models="small,large",
            repeats=3,
            link_repeats=1,
            json=str(tmp_path / "s.json"),
            cells=",".join(statesize.CELLS),
        )
    )
    lines = [
        line.split(", elapsed")[0] + " | " + line.rsplit("(", 1)[-1]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("[bench] statesize progress: ")
    ]
    assert calls == [(m, c) for m in ("small", "large") for c in statesize.CELLS]
    assert lines == [
        f"[bench] statesize progress: cells {i + 1}/12, events {e} | {note})"
        for i, (e, note) in enumerate(
            [
                (0, "small link"),
                (3, "small shadow"),
                (6, "small noshadow"),
                (9, "small unexpected"),
                (12, "small unexpected_overlap"),
                (15, "small injob_restart"),
                (15, "large link"),
                (18, "large shadow"),
                (21, "large noshadow"),
                (24, "large unexpected"),
                (27, "large unexpected_overlap"),
                (30, "large injob_restart"),
            ]
        )
    ]


@pytest.mark.parametrize(
    "name,called",
    [
        ("shadow", ("drains", True)),
        ("noshadow", ("drains", False)),
        ("unexpected", ("kills", False)),
        ("unexpected_overlap", ("kills", True)),
        ("injob_restart", ("restarts",)),
    ],
)
def test_cell_runs_the_measurement_of_its_name(monkeypatch, tmp_path, name, called):
    from benchmarks import statesize

    monkeypatch.setattr(statesize, "drains", lambda out, model, shadow, n: ("drains", shadow))
    monkeypatch.setattr(statesize, "kills", lambda out, model, n, overlap: ("kills", overlap))
    monkeypatch.setattr(statesize, "restarts", lambda out, model, n: ("restarts",))
    assert statesize.cell(tmp_path, "small", name, 2) == called
