"""Table-driven tests of tmslurm.slurm.parse over real Slurm 22.05 and 24.11 output (tests/fixtures/slurm)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from tests.unit import slurm_text as T
from tmslurm.core.errors import SlurmParseError
from tmslurm.slurm import parse as P

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11")
PREFIX = {"22.05": "tmn", "24.11": "tn"}  # node names of each recording
RESV_TIMES = {
    "22.05": ("2026-12-02T10:44:06", "2026-12-02T11:44:06"),
    "24.11": ("2026-12-02T10:45:33", "2026-12-02T11:45:33"),
}
JOB_ID = {"22.05": "10", "24.11": "1"}
REQUEUED_JOB_ID = {"22.05": "11", "24.11": "2"}


def load(version: str, name: str) -> tuple[str, str]:
    """(command line, output) of a recorded sample: its first line is ``$ <command>``."""
    first, _, body = (FIXTURES / version / name).read_text().partition("\n")
    assert first.startswith("$ "), name
    return first[2:], body


def names(version: str, *nums: int) -> list[str]:
    return [f"{PREFIX[version]}{n}" for n in nums]


# ---------------------------------------------------------------------------------------------
# scontrol show node
# ---------------------------------------------------------------------------------------------

# file -> (node number, state, base, flags, reason, classification, drain phase); per version where
# the recordings differ.
NODE_CASES = {
    "scontrol-show-node-idle.txt": (1, "IDLE", "IDLE", set(), "", "ok", None),
    "scontrol-show-node-draining.txt": (
        2,
        "MIXED+DRAIN",
        "MIXED",
        {"DRAIN"},
        "firmware upgrade",
        "maintenance",
        "draining",
    ),
    "scontrol-show-node-reboot-asap.txt": (
        3,
        "MIXED+DRAIN+REBOOT_REQUESTED",
        "MIXED",
        {"DRAIN", "REBOOT_REQUESTED"},
        "kernel update",
        "maintenance",
        "draining",
    ),
    "scontrol-show-node-down.txt": (
        4,
        "DOWN+NOT_RESPONDING",
        "DOWN",
        {"NOT_RESPONDING"},
        "Not responding",
        "failure",
        None,
    ),
}
NOT_RESPONDING = {
    # 22.05: the killed node still holds its job; 24.11: the job is already completing.
    "22.05": (4, "MIXED+NOT_RESPONDING", "MIXED", {"NOT_RESPONDING"}, "", "failure", None),
    "24.11": (4, "IDLE+COMPLETING+NOT_RESPONDING", "IDLE", {"COMPLETING", "NOT_RESPONDING"}, "", "failure", None),
}


def node_cases():
    for version in VERSIONS:
        for name, expected in NODE_CASES.items():
            yield pytest.param(version, name, expected, id=f"{version}-{name}")
        yield pytest.param(
            version, "scontrol-show-node-not-responding.txt", NOT_RESPONDING[version], id=f"{version}-not-responding"
        )


@pytest.mark.parametrize("version,name,expected", node_cases())
def test_scontrol_show_node(version, name, expected):
    cmd, text = load(version, name)
    num, state, base, flags, reason, kind, phase = expected
    (node,) = P.parse_nodes(text, cmd=cmd)
    assert node.name == f"{PREFIX[version]}{num}"
    assert (node.state, node.base_state, set(node.flags)) == (state, base, flags)
    assert node.reason == reason
    assert P.classify(node) == kind
    assert node.drain_phase == phase
    assert node.raw["Version"].startswith(version)
    assert "PREEMPT_DYNAMIC" in node.raw["OS"]


def test_reboot_asap_keeps_next_state_in_raw():
    for version in VERSIONS:
        cmd, text = load(version, "scontrol-show-node-reboot-asap.txt")
        assert P.parse_nodes(text, cmd=cmd)[0].raw["NextState"] == "RESUME"


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_oneline_show_node(version):
    cmd, text = load(version, "scontrol-o-show-node-idle.txt")
    nodes = P.parse_nodes(text, cmd=cmd)
    assert [n.name for n in nodes] == names(version, 1, 2, 3, 4)
    assert {(n.state, n.reason, P.classify(n)) for n in nodes} == {("IDLE", "", "ok")}
    assert nodes[0].raw["OS"].startswith("Linux 6.18") and "PREEMPT_DYNAMIC" in nodes[0].raw["OS"]
    assert nodes[0].raw["RealMemory"] == "2000"


# ---------------------------------------------------------------------------------------------
# scontrol show job
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "name,node_list,nums",
    [
        ("scontrol-show-job-running.txt", "[1-3]", (1, 2, 3)),
        ("scontrol-o-show-job-running.txt", "[1-3]", (1, 2, 3)),
        ("scontrol-show-job-after-shrink.txt", "[1,3]", (1, 3)),
    ],
)
def test_scontrol_show_job_running_and_shrunk(version, name, node_list, nums):
    cmd, text = load(version, name)
    (job,) = P.parse_jobs(text, cmd=cmd)
    assert job.job_id == JOB_ID[version]
    assert (job.state, job.reason) == ("RUNNING", "")
    assert job.node_list == PREFIX[version] + node_list
    assert job.nodes == names(version, *nums)
    assert job.batch_host == f"{PREFIX[version]}1"
    assert (job.restarts, job.requeue) == (0, True)


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_show_job_requeued_single_node(version):
    cmd, text = load(version, "scontrol-show-job-single-node-requeued.txt")
    (job,) = P.parse_jobs(text, cmd=cmd)
    assert job.job_id == REQUEUED_JOB_ID[version]
    assert (job.state, job.reason, job.restarts, job.requeue) == ("PENDING", "BeginTime", 1, True)
    assert (job.node_list, job.nodes, job.batch_host) == ("", [], None)
    assert job.raw["ReqNodeList"] == f"{PREFIX[version]}4"


# ---------------------------------------------------------------------------------------------
# reservations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["scontrol-show-res-maint.txt", "scontrol-o-show-res-maint.txt"])
def test_scontrol_show_res(version, name):
    cmd, text = load(version, name)
    (resv,) = P.parse_reservations(text, cmd=cmd)
    start, end = RESV_TIMES[version]
    assert resv.name == "maint1"
    assert (resv.start_time, resv.end_time) == (datetime.fromisoformat(start), datetime.fromisoformat(end))
    assert resv.nodes == names(version, 1) and resv.node_list == f"{PREFIX[version]}1"
    assert resv.flags == {"MAINT", "IGNORE_JOBS", "SPEC_NODES"} and resv.is_maint
    assert resv.state == "INACTIVE"


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_T(version):
    cmd, text = load(version, "sinfo-T-maint.txt")
    (resv,) = T.parse_sinfo_reservations(text, cmd=cmd)
    start, end = RESV_TIMES[version]
    assert (resv.name, resv.state, resv.nodes) == ("maint1", "INACTIVE", names(version, 1))
    assert (resv.start_time, resv.end_time) == (datetime.fromisoformat(start), datetime.fromisoformat(end))
    assert resv.flags == frozenset() and not resv.is_maint  # sinfo -T does not print flags


# ---------------------------------------------------------------------------------------------
# sinfo -N -O NodeList,StateComplete,Reason
# ---------------------------------------------------------------------------------------------

FW, KU, NR = "firmware upgrade", "kernel update", "Not responding"
# Where 22.05's sinfo says "allocated" for a node scontrol calls MIXED, 24.11 says "mixed".
SINFO = {
    ("22.05", "sinfo-N-O-idle.txt"): [("idle", ""), ("idle", ""), ("idle", ""), ("idle", "")],
    ("22.05", "sinfo-N-O-draining.txt"): [("mixed", ""), ("allocated+drain", FW), ("mixed", ""), ("idle", "")],
    ("22.05", "sinfo-N-O-reboot-asap.txt"): [
        ("mixed", ""),
        ("allocated+drain", FW),
        ("allocated+drain+reboot_requested", KU),
        ("idle", ""),
    ],
    ("22.05", "sinfo-N-O-drained-after-shrink.txt"): [
        ("mixed", ""),
        ("idle+drain", FW),
        ("allocated+drain+reboot_requested", KU),
        ("idle", ""),
    ],
    ("22.05", "sinfo-N-O-down.txt"): [
        ("mixed", ""),
        ("idle+drain", FW),
        ("allocated+drain+reboot_requested", KU),
        ("down+not_responding", NR),
    ],
    ("24.11", "sinfo-N-O-idle.txt"): [("idle", ""), ("idle", ""), ("idle", ""), ("idle", "")],
    ("24.11", "sinfo-N-O-draining.txt"): [("mixed", ""), ("mixed+drain", FW), ("mixed", ""), ("idle", "")],
    ("24.11", "sinfo-N-O-reboot-asap.txt"): [
        ("mixed", ""),
        ("mixed+drain", FW),
        ("mixed+drain+reboot_requested", KU),
        ("idle", ""),
    ],
    ("24.11", "sinfo-N-O-drained-after-shrink.txt"): [
        ("mixed", ""),
        ("idle+drain", FW),
        ("mixed+drain+reboot_requested", KU),
        ("idle", ""),
    ],
    ("24.11", "sinfo-N-O-not-responding.txt"): [
        ("mixed", ""),
        ("idle+drain", FW),
        ("mixed+drain+reboot_requested", KU),
        ("idle+completing+not_responding", ""),
    ],
    ("24.11", "sinfo-N-O-down.txt"): [
        ("mixed", ""),
        ("idle+drain", FW),
        ("mixed+drain+reboot_requested", KU),
        ("down+not_responding", NR),
    ],
}


@pytest.mark.parametrize("version,name", list(SINFO), ids=[f"{v}-{n}" for v, n in SINFO])
def test_sinfo_nodes(version, name):
    cmd, text = load(version, name)
    rows = T.parse_sinfo_nodes(text, cmd=cmd)
    expected = [
        (f"{PREFIX[version]}{i + 1}", frozenset(s.upper().split("+")), r)
        for i, (s, r) in enumerate(SINFO[version, name])
    ]
    assert [tuple(row) for row in rows] == expected
    node, states, reason = rows[1]  # unpacks as a 3-tuple
    assert node == f"{PREFIX[version]}2"


def test_sinfo_command_matches_recorded_widths():
    cmd, _ = load("22.05", "sinfo-N-O-idle.txt")
    assert cmd == "sinfo " + " ".join(T.sinfo_node_args())


def test_sinfo_row_to_node_info_classifies_like_scontrol():
    cmd, text = load("22.05", "sinfo-N-O-down.txt")
    infos = [row.to_node_info() for row in T.parse_sinfo_nodes(text, cmd=cmd)]
    assert [(i.base_state, P.classify(i), i.drain_phase) for i in infos] == [
        ("MIXED", "ok", None),
        ("IDLE", "maintenance", "drained"),
        ("ALLOCATED", "maintenance", "draining"),
        ("DOWN", "failure", None),
    ]
    assert infos[3].state == "DOWN+NOT_RESPONDING" and infos[3].reason == NR


# ---------------------------------------------------------------------------------------------
# squeue, sacct
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue(version):
    p, job, requeued = PREFIX[version], JOB_ID[version], REQUEUED_JOB_ID[version]
    cmd, text = load(version, "squeue-job-running.txt")
    assert T.parse_squeue(text, cmd=cmd) == [
        {"job_id": job, "state": "RUNNING", "node_list": f"{p}[1-3]", "num_nodes": "3", "reason": "None"}
    ]
    cmd, text = load(version, "squeue-after-node-loss.txt")
    assert T.parse_squeue(text, cmd=cmd) == [
        {"job_id": requeued, "state": "PENDING", "node_list": "", "num_nodes": "1", "reason": "BeginTime"},
        {"job_id": job, "state": "RUNNING", "node_list": f"{p}[1,3]", "num_nodes": "2", "reason": "None"},
    ]


def test_squeue_command_matches_format():
    cmd, _ = load("24.11", "squeue-after-node-loss.txt")
    assert cmd.endswith(T.SQUEUE_FORMAT)


def test_sacct_parsable2_22_05():
    cmd, text = load("22.05", "sacct-parsable2.txt")
    rows = P.parse_sacct(text, cmd=cmd)
    assert len(rows) == 13
    assert list(rows[0]) == ["JobID", "JobName", "State", "NodeList", "ExitCode"]
    assert rows[2]["NodeList"] == "None assigned"
    assert rows[4]["State"] == "CANCELLED by 0"
    # The shrink shows up as a RESIZING record and then a RUNNING record of the same job id.
    assert [(r["State"], r["NodeList"]) for r in rows if r["JobID"] == "10"] == [
        ("RESIZING", "tmn[1-3]"),
        ("RUNNING", "tmn[1,3]"),
    ]
    assert rows[-2]["State"] == "NODE_FAIL" and rows[-1]["ExitCode"] == ""


# ---------------------------------------------------------------------------------------------
# empty outputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn,text",
    [
        (P.parse_nodes, ""),
        (P.parse_nodes, "No nodes in the system\n"),
        (P.parse_jobs, "\n"),
        (P.parse_jobs, "No jobs in the system\n"),
        (P.parse_reservations, "No reservations in the system\n"),
        (T.parse_sinfo_nodes, ""),
        (T.parse_sinfo_reservations, ""),
        (T.parse_squeue, ""),
        (P.parse_sacct, ""),
        (P.parse_sacct, "JobID|State\n"),
    ],
)
def test_empty_output_is_no_rows(fn, text):
    assert fn(text) == []


# ---------------------------------------------------------------------------------------------
# hostlists: expected values recorded from Slurm 22.05 `scontrol show hostnames|hostlist`
# ---------------------------------------------------------------------------------------------

EXPAND = [
    ("n[01-03,7],x[1-2]y[3-4],plain", "n01 n02 n03 n7 x1y3 x1y4 x2y3 x2y4 plain"),
    ("node[1-3,5]", "node1 node2 node3 node5"),
    ("n[01-10]", "n01 n02 n03 n04 n05 n06 n07 n08 n09 n10"),
    ("a,b,c", "a b c"),
    ("n[8-11]", "n8 n9 n10 n11"),
    ("rack[1-2]-n[1-2]", "rack1-n1 rack1-n2 rack2-n1 rack2-n2"),
    ("n[001-003]", "n001 n002 n003"),
    ("tmn[1,3]", "tmn1 tmn3"),
    ("n[01-3]", "n01 n02 n03"),
    ("n[1-03]", "n1 n2 n3"),
    ("n[1-2],,n3", "n1 n2 n3"),
    ("n[1-2][3-4]", "n13 n14 n23 n24"),
    (" n1", "n1"),
    ("", ""),
    ("tn4", "tn4"),
    ("n[1-2]-ib", "n1-ib n2-ib"),  # Slurm 22.05 rejects this; we accept it
]
COMPRESS = [
    ("n01,n02,n03,n07", "n[01-03,07]"),
    ("n1,n3,n2", "n[1,3,2]"),
    ("n9,n10,n11", "n[9-11]"),
    ("n01,n1", "n[01,1]"),
    ("a,b", "a,b"),
    ("n1-ib,n2-ib", "n1-ib,n2-ib"),
    ("x1y3,x1y4,x2y3", "x1y[3-4],x2y3"),
    ("n1,n1", "n[1,1]"),
    ("foo", "foo"),
    ("n001,n002,n010", "n[001-002,010]"),
    ("n1,a,n2", "n1,a,n2"),
    ("n1,n2,a,n3", "n[1-2],a,n3"),
    ("n1,n10", "n[1,10]"),
    ("n01,n02,n3", "n[01-02,3]"),
    ("n09,n10", "n[09-10]"),
    ("n099,n100", "n[099-100]"),
    ("n1,n2,n2", "n[1-2,2]"),
    ("a1b,a2b", "a1b,a2b"),
    ("n0,n1", "n[0-1]"),
    ("node-1,node-2", "node-[1-2]"),
    ("n1.x,n2.x", "n1.x,n2.x"),
    ("n007,n8", "n[007,8]"),
    ("tmn1,tmn3", "tmn[1,3]"),
    ("", ""),
]


@pytest.mark.parametrize("expr,expected", EXPAND)
def test_expand_hostlist(expr, expected):
    assert P.expand_hostlist(expr) == expected.split()


@pytest.mark.parametrize("hosts,expected", COMPRESS)
def test_compress_hostlist_round_trips(hosts, expected):
    host_list = [h for h in hosts.split(",") if h]
    assert P.compress_hostlist(host_list) == expected
    assert P.expand_hostlist(expected) == host_list


@pytest.mark.parametrize("expr", ["n[3-1]", "n[1-3", "n1]", "n[a-b]", "n[]", "n[[1]]", "n[1-2,x]"])
def test_bad_hostlist(expr):
    with pytest.raises(SlurmParseError, match="invalid hostlist"):
        P.expand_hostlist(expr)


# ---------------------------------------------------------------------------------------------
# state classification
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state,kind",
    [
        ("IDLE", "ok"),
        ("MIXED", "ok"),
        ("ALLOCATED+COMPLETING", "ok"),
        ("UNKNOWN", "ok"),
        ("RESERVED", "ok"),
        ("IDLE+PLANNED", "ok"),
        ("mix-", "ok"),
        ("MIXED+DRAIN", "maintenance"),
        ("IDLE+DRAIN", "maintenance"),
        ("DRAINED", "maintenance"),
        ("drng", "maintenance"),
        ("drain", "maintenance"),
        ("MIXED+DRAIN+REBOOT_REQUESTED", "maintenance"),
        ("mix@", "maintenance"),
        ("alloc$", "maintenance"),
        ("IDLE+MAINT", "maintenance"),
        ("IDLE+POWER_DOWN", "maintenance"),
        ("idle!", "maintenance"),
        ("IDLE+REBOOT_ISSUED", "maintenance"),
        ("DOWN", "failure"),
        ("DOWN+DRAIN", "failure"),
        ("down*", "failure"),
        ("idle*", "failure"),
        ("IDLE+DRAIN+NOT_RESPONDING", "failure"),
        ("MIXED+NOT_RESPONDING", "failure"),
        ("IDLE+COMPLETING+NOT_RESPONDING", "failure"),
        ("FAIL", "failure"),
        ("ALLOCATED+FAIL", "failure"),
        ("FAILING", "failure"),
        ("idle~", "failure"),
        ("IDLE+POWERED_DOWN", "failure"),
        ("idle%", "failure"),
        ("DOWN+DRAIN+REBOOT_REQUESTED", "failure"),
    ],
)
def test_classify(state, kind):
    assert P.classify(state) == kind


def test_classify_accepts_word_iterables_and_rows():
    assert P.classify(["idle", "drain"]) == "maintenance"
    assert P.classify({"DOWN"}) == "failure"
    assert P.classify(T.SinfoNode("n1", frozenset({"IDLE"}), "").to_node_info()) == "ok"


def test_parse_state_suffixes_and_abbreviations():
    assert P.parse_state("down*") == ("DOWN", frozenset({"NOT_RESPONDING"}))
    assert P.parse_state("drng") == ("DRAINING", frozenset({"DRAIN"}))
    assert P.parse_state("mix$") == ("MIXED", frozenset({"MAINT"}))
    assert P.parse_state("idle+drain") == ("IDLE", frozenset({"DRAIN"}))
    with pytest.raises(ValueError):
        P.parse_state("IDLE+DR?IN")


# ---------------------------------------------------------------------------------------------
# malformed output: SlurmParseError naming the command and quoting the line
# ---------------------------------------------------------------------------------------------

SINFO_LINE = f"{'tmn1':<40}{'idle':<60}{'none':<80}"


@pytest.mark.parametrize(
    "fn,text,quoted",
    [
        (P.parse_nodes, "hello world\n", "hello world"),
        (P.parse_nodes, "NodeName=tmn1 Arch=x86_64 CoresPer\n", "NodeName=tmn1 Arch=x86_64 CoresPer"),
        (P.parse_nodes, "NodeName=tmn1 State=IDLE+DR?IN\n", "State=IDLE+DR?IN"),
        (P.parse_nodes, "NodeName=tmn1 State=IDLE\n   ### garbage ###\n", "### garbage ###"),
        (P.parse_jobs, "JobId=10 JobName=wrap\n   JobState=RUNNING Reason=None\n", "JobId=10 JobName=wrap"),
        (P.parse_jobs, "JobId=10 JobState=RUNNING Restarts=x Requeue=1\n", "JobId=10"),
        (P.parse_jobs, "JobId=10 JobState=RUNNING Restarts=0 NodeList=n[3-1]\n", "NodeList=n[3-1]"),
        (P.parse_reservations, "ReservationName=m StartTime=soon EndTime=later Nodes=n1\n", "StartTime=soon"),
        (P.parse_reservations, "ReservationName=m StartTime=2026-12-02T10:44:06\n", "ReservationName=m"),
        (T.parse_sinfo_nodes, "tmn1 idle none\n", "tmn1 idle none"),
        (T.parse_sinfo_nodes, "tmn1\n", "tmn1"),
        (T.parse_sinfo_nodes, f"{'tmn1':<40}{'x' * 60}none\n", "x" * 40),  # state fills its column
        (T.parse_sinfo_nodes, f"{'n' * 40}{'idle':<60}none\n", "n" * 40),  # node fills its column
        (T.parse_sinfo_reservations, "maint1 INACTIVE 2026-12-02T10:44:06\n", "maint1 INACTIVE"),
        (T.parse_sinfo_reservations, "maint1 INACTIVE now later 01:00:00 tmn1\n", "maint1 INACTIVE now"),
        (T.parse_squeue, "10|RUNNING\n", "10|RUNNING"),
        (P.parse_sacct, "JobID|State\n10|RUNNING|extra\n", "10|RUNNING|extra"),
        (P.parse_sacct, "<html>error</html>\n", "<html>error</html>"),
        (P.parse_sbatch_parsable, "Submitted batch job 12\n", "Submitted batch job 12"),
        (P.parse_version, "garbage 1\n", "garbage 1"),
    ],
)
def test_malformed_output_raises_parse_error_quoting_the_line(fn, text, quoted):
    with pytest.raises(SlurmParseError) as info:
        fn(text, cmd="the-command --flag")
    message = str(info.value)
    assert quoted in message
    assert "the-command --flag" in message


def test_sinfo_default_width_truncation_is_detected():
    # With sinfo's default -O width (20) the state below is cut to "allocated+drain+rebo".
    line = f"{'tmn3':<20}{'allocated+drain+reboot_requested'[:20]}{'kernel update':<20}\n"
    with pytest.raises(SlurmParseError, match="truncated"):
        T.parse_sinfo_nodes(line, widths=(20, 20, 20))
    ok = f"{'tmn3':<20}{'mixed+drain':<20}{'kernel update':<20}\n"
    assert T.parse_sinfo_nodes(ok, widths=(20, 20, 20)) == [("tmn3", frozenset({"MIXED", "DRAIN"}), "kernel update")]


def test_valid_sinfo_line_built_like_the_tests_parses():
    assert T.parse_sinfo_nodes(SINFO_LINE) == [("tmn1", frozenset({"IDLE"}), "")]


def test_parse_error_truncates_long_lines():
    with pytest.raises(SlurmParseError) as info:
        P.parse_nodes("x" * 5000)
    assert len(str(info.value)) < 400 and "..." in str(info.value)


def test_sbatch_parsable_and_version():
    assert P.parse_sbatch_parsable("42\n") == "42"
    assert P.parse_sbatch_parsable("42;cluster\n") == "42"
    assert P.parse_version("slurm 22.05.8\n") == "22.05.8"
    assert P.parse_version("slurm 24.11.5\n") == "24.11.5"
