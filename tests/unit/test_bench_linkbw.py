"""benchmarks.linkbw's pure parts: lab node addresses from the lab's status, and a row's rates."""

from __future__ import annotations

from benchmarks.linkbw import lab_addresses, row

STATUS = """mariadbd running (pid 812)
slurmctld running (pid 901)
lab: bridge tmslab0 10.213.0.1/24 (up), cgroup v2 freezer
  node1   addr 10.213.0.11   power on          link up      frozen no  procs 3
  node2   addr 10.213.0.12   power off         link down    frozen yes procs 0
"""


def test_lab_addresses_reads_every_node_line_and_nothing_else():
    assert lab_addresses(STATUS) == {"node1": "10.213.0.11", "node2": "10.213.0.12"}
    assert lab_addresses("lab is down\n") == {}


def test_row_gives_p50_rates_their_range_and_the_ratio():
    out = {"bytes": 1_000_000_000, "samples": {"link": [0.5, 0.25, 1.0], "transfer": [1.0, 2.0, 0.5]}}
    r = row("large", out)
    assert (r["state_mb_per_rank"], r["n"]) == (1000.0, 3)
    assert (r["link_gbps"], r["transfer_gbps"]) == (2.0, 1.0)
    assert r["link_gbps_range"] == [1.0, 4.0] and r["transfer_gbps_range"] == [0.5, 2.0]
    assert r["transfer_over_link"] == 0.5
