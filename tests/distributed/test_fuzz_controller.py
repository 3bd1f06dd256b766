"""Hypothesis fuzz of a live controller: 1,500 generated first lines, the run does not notice.

Messages of every type (agent, request, controller, unknown), with wrong types, missing and extra
fields, huge numbers, unicode, truncated lines and garbage bytes, with the right token, a wrong one
or none, and hellos that report the pid of a sentinel process. The run must end with the same final
hashes as the uninterrupted run, each message must get the one reply it calls for
(:func:`expected_reply`: none to a first line over the gate's pre-auth limit, a status to an
authenticated status request, an ``error`` to anything else), and the sentinel must survive. The
fuzzed run has no step limit of its own: when the fuzz is done, the test stops it with one real
``stop`` request and compares it with a clean run of as many steps.
"""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.distributed.test_hostile_clients import LAYOUT, addr_of, all_up, sentinel  # noqa: F401 (fixture)
from tests.distributed.test_recovery import assert_exact
from tmslurm.controller.gateauth import GateLimits
from tmslurm.core.errors import ProtocolError
from tmslurm.wire.messages import BadMessage, StatusRequest, decode_first
from tmslurm.wire.protocol import exchange, parse_line, read_token, token_ok

pytestmark = pytest.mark.dist
EXAMPLES = 1500  # derandomized: the same 1,500 lines every run (2,500 took ~40 s more of CI)
# The default heartbeat timeout: a rank still starting (before its ``started``) is allowed
# runtime.connect_timeout_s, which covers the start-up silence once seen here under a loaded CI host.
FUZZ_RUN = ["train.steps=1000000", "bench.step_delay_s=0.05"]
TYPES = [
    "hello",
    "hb",
    "started",
    "groups",
    "vote",
    "progress",
    "prepared",
    "switched",
    "left",
    "aborted",
    "recovered",
    "comm_error",
    "fault",
    "done",
    "ready",
    "joined",
    "join_failed",
    "status",
    "stop",
    "notice",
    "signed_notice",
    "welcome",
    "decision",
    "abort",
    "finish",
    "error",
    "",
    "__class__",
    "hello\u0000",
    "vote" * 50,
]
FIELDS = [
    "kind",
    "id",
    "pid",
    "node",
    "host",
    "rank",
    "step",
    "epoch",
    "event",
    "deadline",
    "reason",
    "source",
    "loss",
    "dt",
    "digest",
    "state_digest",
    "status",
    "error",
    "index",
    "stage",
    "role",
    "joiner",
    "bytes",
    "ids",
    "gens",
    "peak_rss_mb",
    "phase1_s",
    "phase2_s",
    "transfer_s",
    "build_s",
    "payload",
    "signature",
    "type",
    "token",
    "zzz",
]
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 8))
values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        numbers,
        st.text(max_size=40),
        st.sampled_from(["worker", "standby", "local0", "maintenance", "failure"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


@st.composite
def lines(draw, token: str, pids: list[int]) -> bytes:
    msg = {"type": draw(st.sampled_from(TYPES))}
    msg.update(draw(st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)))
    if msg["type"] == "hello" and draw(st.booleans()):  # a well-formed hello reporting someone else's pid
        msg.update(
            token=token,
            kind=draw(st.sampled_from(["worker", "standby"])),
            id=draw(st.integers(0, 5)),
            pid=draw(st.sampled_from(pids)),
            node="local0",
        )
    auth = draw(st.sampled_from(["good", "good", "bad", "none", "keep"]))
    if auth == "good":
        msg["token"] = token
    elif auth == "bad":
        msg["token"] = draw(st.text(max_size=40))
    elif auth == "none":
        msg.pop("token", None)
    if msg.get("token") == token and msg["type"] in ("stop", "notice"):
        _defuse(msg, token)
    text = json.dumps(msg, ensure_ascii=draw(st.booleans()), allow_nan=True).encode()
    framing = draw(st.sampled_from(["line", "line", "truncated", "garbage", "no_newline"]))
    if framing == "truncated":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))] + b"\n"
    if framing == "garbage":
        return draw(st.binary(max_size=300)) + b"\n"
    return text if framing == "no_newline" else text + b"\n"


def _defuse(msg: dict, token: str) -> None:
    """An authenticated stop, or a notice naming one of the run's ranks or nodes, would legitimately
    change the run: keep those messages but aim them at a rank and a node the run does not have."""
    if msg["type"] == "stop":
        msg["token"] = token + "x"
    else:
        msg["rank"], msg["node"] = 999, "no-such-node"


def expected_reply(data: bytes, token: str) -> str:
    """The one reply (its type) the gate owes a connection that sent ``data``, judged on its first line
    as the gate judges it: ``none`` when the line reaches ``GateLimits.preauth_max_line`` (dropped
    unanswered, ``preauth_dropped``); else parsed, authenticated, then validated: ``status`` to a
    status request with the run token, ``error`` to anything else. A valid hello with the token is
    refused too (every agent of the run is up: none is expected), and so is a stop or a notice
    (:func:`_defuse`)."""
    line = data.split(b"\n", 1)[0]
    if len(line) >= GateLimits().preauth_max_line:
        return "none"
    try:
        raw = parse_line(line)
        if raw["type"] == "signed_notice" or not token_ok(raw.get("token"), token):
            return "error"
        msg = decode_first(raw)
    except (ProtocolError, BadMessage):
        return "error"
    return "status" if isinstance(msg, StatusRequest) else "error"


def send(addr: dict, data: bytes) -> dict | None:
    with socket.create_connection((addr["host"], addr["port"]), timeout=30) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reply = sock.makefile("rb").readline()
    return json.loads(reply) if reply else None


def test_1500_generated_messages_change_nothing(launch, baseline, sentinel):  # noqa: F811
    run = launch(*LAYOUT, *FUZZ_RUN)
    all_up(run)
    addr, token = addr_of(run), read_token(run.run_dir)
    pids = [sentinel.pid, -1, 0, 1, 2**31, -(2**31)]
    replies: dict[str, int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(data=lines(token, pids))
    def fuzz(data: bytes) -> None:
        assert run.proc.poll() is None, "the run ended (or crashed) while fuzzing:\n" + run.output()[-3000:]
        reply = send(addr, data)
        kind = "none" if reply is None else reply["type"]
        assert kind == expected_reply(data, token), (data, reply)
        replies[kind] = replies.get(kind, 0) + 1

    fuzz()
    assert set(replies) <= {"none", "error", "status"} and sum(replies.values()) >= EXAMPLES, replies
    assert replies["error"] > EXAMPLES // 2, replies
    assert exchange(addr, {"type": "stop", "token": token})["type"] == "ok"
    s = run.wait()
    assert_exact(s, baseline(*LAYOUT, f"train.steps={s['steps']}"))
    assert s["events"] == []
    assert sentinel.poll() is None, "a process outside the run was signalled"
    journal = run.journal()
    assert not any(e["type"] in ("handler_error", "fenced", "abort", "restart") for e in journal)
    assert (
        sum(e["type"] in ("bad_message", "auth_refused", "hello_refused", "preauth_dropped") for e in journal)
        > EXAMPLES // 2
    )
