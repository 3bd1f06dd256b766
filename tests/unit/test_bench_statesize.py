"""benchmarks.statesize's pure parts: the source's RSS around an event, and a row's p50s and floor."""

from __future__ import annotations

from benchmarks.statesize import row, source_rss, table


def _ev(pause: float, down: float, **more) -> dict:
    return {"pause_s": pause, "downtime_s": down, "transfer_s": 0.0, "first_step_s": 0.1, "gap_s": pause + 0.1, **more}


def test_source_rss_reads_the_sources_peak_before_and_after_the_event():
    summary = {"step_log": [{"t_end": 1.0, "peak_rss_mb": {"0": 100.0, "3": 200.0}}, {"t_end": 2.0, "peak_rss_mb": {}},
                            {"t_end": 3.0, "peak_rss_mb": {"3": 204.0}}]}
    assert source_rss(summary, {"sources": [3], "last_commit_t": 2.0}) == {"before_mb": 200.0, "after_mb": 204.0}
    assert source_rss(summary, {"sources": [0], "last_commit_t": 2.0}) == {"before_mb": 100.0, "after_mb": 100.0}
    assert source_rss(summary, {"sources": []}) == {"before_mb": None, "after_mb": None}


def test_row_takes_p50s_per_cell_and_the_floor_from_the_link():
    shadow = [_ev(0.05, 0.01, shadowed=True, shadow_matched=True, shadow_catchup_s=c) for c in (1.0, 2.0, 3.0)]
    plain = [_ev(p, p - 0.04) for p in (0.5, 0.7, 0.6)]
    kill = [_ev(1.2, 1.1, detect_s=0.9, source_rss={"before_mb": 500.0, "after_mb": 510.0}) for _ in range(3)]
    restart = [_ev(9.0, 9.5), _ev(11.0, 10.5), _ev(10.0, 10.0)]
    summary = {"state_bytes": {"0": 1_000_000_000, "1": 900_000_000}, "memory": {"standby_rss_mb": 1200.0,
                                                                                  "largest_rank_peak_rss_mb": 1400.0}}
    cells = {"shadow": {"summary": summary, "events": shadow}, "noshadow": {"summary": summary, "events": plain},
             "unexpected": {"summary": summary, "events": kill}, "injob_restart": {"summary": summary, "events": restart}}
    r = row("large", {"link_gbps": 2.0, "transfer_gbps": 1.6}, cells)
    assert (r["state_mb_per_rank"], r["floor_s"]) == (1000.0, 0.5)
    assert (r["planned_shadow_pause_p50_s"], r["planned_pause_p50_s"], r["unexpected_pause_p50_s"]) == (0.05, 0.6, 1.2)
    assert r["injob_restart_planned_downtime_p50_s"] == 10.0 and r["shadow_catchup_p50_s"] == 2.0
    assert r["all_shadowed"] is True and r["n"] == {"shadow": 3, "noshadow": 3, "unexpected": 3, "injob_restart": 3}
    assert (r["source_peak_rss_before_mb"], r["source_peak_rss_during_mb"]) == (500.0, 510.0)
    assert len(r["samples"]["noshadow"]) == 3 and "large" in table([r])
