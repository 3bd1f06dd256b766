"""Typed messages at the boundary, signed notices, final hashes, the transfer header, trusted runs."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tmslurm.cli.notify_targets import Skip, Target, vet
from tmslurm.comm.transfer import _parse_header, _split
from tmslurm.controller.final_hashes import final_hashes
from tmslurm.core.errors import CommError
from tmslurm.core.signing import (
    NoticeRefused,
    NoticeVerifier,
    generate_keypair,
    load_private_key,
    load_public_key,
    signed_notice,
)
from tmslurm.train.schedule import state_digest
from tmslurm.wire.messages import (
    Aborted,
    BadMessage,
    CommErrorReport,
    Decision,
    Done,
    Exited,
    FaultFired,
    Groups,
    Heartbeat,
    Hello,
    Joined,
    JoinFailed,
    Left,
    NoticeRequest,
    Prepared,
    Progress,
    Ready,
    Recovered,
    Rejoin,
    RelayHello,
    Started,
    Stopped,
    Switched,
    Vote,
    decode_agent,
    decode_controller,
    decode_first,
    encode,
)
from tmslurm.wire.mux import is_vote
from tmslurm.wire.protocol import encode_line

VOTE = {"type": "vote", "step": 3, "epoch": 1, "rank": 0, "loss": 2.5, "dt": 0.01, "peak_rss_mb": 100.0}


@pytest.mark.parametrize(
    "bad,where",
    [
        ({"type": "notice", "token": "t", "event": "maintenance", "node": ["a"]}, "notice.node"),
        ({"type": "hello", "token": "t", "kind": "worker", "id": 1, "pid": "1", "node": "n"}, "hello.pid"),
        ({"type": "hello", "token": "t", "kind": "worker", "id": True, "node": "n"}, "hello.id"),
        ({"type": "notice", "token": "t", "event": "explode", "rank": 1}, "notice.event"),
        ({"type": "stop", "token": "t", "extra": 1}, "stop.extra"),
        ({"type": "vote", "token": "t"}, "expected tags"),
        ({"type": 7}, "expected tags|valid string"),
    ],
)
def test_bad_first_messages_name_the_field(bad, where):
    with pytest.raises(BadMessage, match=where):
        decode_first(bad)


@pytest.mark.parametrize(
    "change",
    [
        {"rank": -1},
        {"step": 2**40},
        {"dt": float("inf")},
        {"epoch": "1"},
        {"x": 1},
        {"type": "left"},
        {"digest": ""},
        {"peak_rss_mb": None},
    ],
)
def test_bad_agent_messages_are_refused(change):
    with pytest.raises(BadMessage):
        decode_agent({**VOTE, **change})


def test_valid_messages_decode_to_their_type_and_round_trip():
    vote = decode_agent(VOTE)
    assert isinstance(vote, Vote) and vote.rank == 0 and vote.digest is None
    d = decode_controller(json.loads(json.dumps(Decision(step=3, epoch=1, final=True).model_dump(mode="json"))))
    assert isinstance(d, Decision) and d.final and d.switch is None
    assert isinstance(decode_first({"type": "notice", "token": "t", "event": "failure", "rank": 2}), NoticeRequest)


AGENT_SENDS = [  # one of every message an agent, monitor or relay sends, built as the agent builds it
    Heartbeat(),
    Started(rank=1, step=0, groups_s=0.5, ckpt_load_s=0.0),
    Groups(rank=1, step=0, epoch=0, ids={"dp/s0": 140000000000000}, gens={"dp/s0": 0}, peak_rss_mb=300.0),
    Vote(step=3, epoch=1, rank=0, loss=2.5, dt=0.01, peak_rss_mb=100.0),
    Vote(step=3, epoch=1, rank=0, loss=None, dt=0.01, peak_rss_mb=100.0, digest="ab" * 32),
    Progress(step=3, epoch=1, rank=0, loss=None, dt=0.01, peak_rss_mb=100.0),
    Prepared(epoch=2, rank=1, phase1_s=0.2, error=None),
    Prepared(epoch=2, rank=1, joiner=0, phase1_s=0.2),
    Switched(epoch=2, rank=1, phase2_s=0.01),
    Left(rank=1, step=5, transfer_s=0.1, phase2_s=0.01, bytes=1 << 20),
    Aborted(epoch=2, rank=1, step=5, status={"dp/s0": {"sent": 0, "recv": 1, "coll": 2, "pending": 0, "gen": 1}}),
    Recovered(epoch=2, rank=1, build_s=0.3, transfer_s=None),
    CommErrorReport(rank=1, step=5, epoch=1, error="peer gone"),
    FaultFired(index=0, rank=1, step=5, kind="kill"),
    Done(rank=1, stage=0, shard=0, digest="d", state_digest="s", step=9),
    Ready(role="only", stages=[0], warmup_s=1.0, rss_mb=500.0, role_rss_mb=100.0, sandbox_sends_skipped=4),
    Joined(
        epoch=2,
        rank=1,
        joiner=0,
        step=5,
        transfer_s=0.1,
        phase1_s=0.2,
        bytes=10,
        rss_mb=1.0,
        joiner_warm=False,
        warm_reason="cold",
    ),
    JoinFailed(epoch=2, rank=1, error="x"),
    Exited(agent="worker0.1#1", pid=123),
    Stopped(agent="w", pid=1, stopped_s=0.5),
]


@pytest.mark.parametrize("msg", AGENT_SENDS, ids=lambda m: m.type)
def test_what_an_agent_sends_is_what_the_controller_decodes(msg):
    line = encode_line(msg)
    assert encode(msg) == line  # the agent's framing and the messages module agree byte for byte
    assert decode_agent(json.loads(line)) == msg
    assert is_vote(json.loads(line)) is isinstance(msg, Vote)  # a relay aggregates every vote an agent sends


def test_first_lines_an_agent_or_relay_sends_decode_and_a_type_is_still_required():
    hello = Hello(
        token="t",
        kind="standby",
        id=0,
        pid=1,
        node="n",
        host="h",
        rejoin=Rejoin(rank=None, epoch=0, decision=None, vote=None, in_plan=False),
    )
    for first in (hello, Hello(token="t", kind="worker", id=1, node="n"), RelayHello(token="t", node="n")):
        assert decode_first(json.loads(encode_line(first))) == first
    assert json.loads(encode_line(Heartbeat())) == {"type": "hb"}
    with pytest.raises(BadMessage):  # the defaults are for senders: a line without a type is still refused
        decode_agent({k: v for k, v in VOTE.items() if k != "type"})


@pytest.mark.parametrize(
    "junk",
    [None, [], "x", 3, {"type": None}, {"type": "vote" * 1000}, {"type": "vote", **{f"k{i}": i for i in range(500)}}],
)
def test_anything_else_is_a_bad_message_never_another_exception(junk):
    with pytest.raises(BadMessage):
        decode_agent(junk)


@pytest.fixture
def keys(tmp_path):
    generate_keypair(tmp_path / "k", tmp_path / "k.pub")
    generate_keypair(tmp_path / "o", tmp_path / "o.pub")
    assert oct(os.stat(tmp_path / "k").st_mode & 0o777) == "0o600"
    return load_private_key(tmp_path / "k"), load_private_key(tmp_path / "o"), load_public_key(tmp_path / "k.pub")


def test_signed_notice_accepted_once_fresh_for_this_run_only(keys):
    key, other, pub = keys
    v = NoticeVerifier(pub, "run1", max_age_s=60)
    good = signed_notice(key, "run1", "node4", "maintenance", deadline=time.time() + 60, reason="PSU")
    assert v.verify(good).node == "node4"
    cases = [
        (good, "replayed"),
        (signed_notice(other, "run1", "node4", "maintenance"), "bad signature"),
        (signed_notice(key, "run1", "node4", "failure", now=time.time() - 120), "stale"),
        (signed_notice(key, "run2", "node4", "failure"), "signed for run"),
        (good.model_copy(update={"payload": good.payload.model_copy(update={"node": "node5"})}), "bad signature"),
        (good.model_copy(update={"signature": "!!notbase64"}), "bad signature"),
    ]
    for notice, why in cases:
        with pytest.raises(NoticeRefused, match=why):
            v.verify(notice)


def test_final_hashes_equal_replicas_divergence_and_missing_stage():
    ok = final_hashes({0: (0, "a", "sa"), 2: (0, "a", "sa"), 1: (1, "b", "sb"), 3: (1, "b", "sb")}, pp=2)
    assert ok["replicas_equal"] and ok["final_params_sha256"] and ok["final_state_sha256"] and ok["diverging"] == []
    moments = final_hashes({0: (0, "a", "sa"), 2: (0, "a", "sX"), 1: (1, "b", "sb"), 3: (1, "b", "sb")}, pp=2)
    assert moments["final_params_sha256"] is None and moments["final_state_sha256"] is None
    assert moments["replicas_equal"] is False and moments["diverging"] == [
        {"stage": 0, "params": {"a": [0, 2]}, "state": {"sa": [0], "sX": [2]}}
    ]
    missing = final_hashes({0: (0, "a", "sa")}, pp=2)
    assert missing["final_params_sha256"] is None and missing["replicas_equal"] is True


def test_state_digest_sees_optimizer_state_and_key_types():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(3)
    opt.step()
    a = state_digest({"model": {"w": p.detach()}, "optim": opt.state_dict()})
    opt.state[p]["exp_avg_sq"].add_(1e-3)  # parameters unchanged, moments differ
    b = state_digest({"model": {"w": p.detach()}, "optim": opt.state_dict()})
    assert a != b
    assert state_digest({0: 1}) != state_digest({"0": 1})


def test_transfer_header_is_typed_json_and_refuses_anything_else():
    tensors: list = []
    state = {
        "model": {"w": torch.ones(2, 3)},
        "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"betas": (0.9, 0.99), "params": [0]}]},
    }
    header = json.dumps({"n": 2, "s": _split(state, tensors)}).encode()
    skeleton, placed = _parse_header(header)
    assert list(skeleton["optim"]["state"]) == [0] and skeleton["optim"]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert [t.shape for t in placed] == [torch.Size([2, 3]), torch.Size([])]
    for bad in [
        b"\x80\x04\x95pickle",
        b'{"n": 1, "s": {"t": 0, "shape": [2], "dtype": "object"}}',
        b'{"n": 0, "s": {"__reduce__": 1}}',
        b'{"n": 1, "s": []}',
        b"[" * 100000,
    ]:
        with pytest.raises(CommError):
            _parse_header(bad)
    with pytest.raises(CommError):
        _split({"x": object()}, [])


def test_vet_checks_owner_and_modes(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "controller.json").write_text('{"host": "127.0.0.1", "port": 5}')
    (run / "token").write_text("t")
    os.chmod(run / "controller.json", 0o644)
    assert vet(run, read_token=True, named=True) == Target(run_dir=run, host="127.0.0.1", port=5, token="t")
    os.chmod(run / "controller.json", 0o666)
    assert "writable by group or others" in _why(vet(run, read_token=False, named=True))
    os.chmod(run / "controller.json", 0o644)
    (run / "token").unlink()
    (run / "token").symlink_to(run / "controller.json")
    assert "token is a symlink" in _why(vet(run, read_token=True, named=True))
    assert "no such run directory" in _why(vet(tmp_path / "nope", read_token=False, named=True))


def _why(result: Skip | Target) -> str:
    assert isinstance(result, Skip) and result.live
    return result.why


@pytest.mark.parametrize(
    "sizes,bucket,small,expected",
    [
        ([], 4, 2, []),
        ([0, 0], 4, 2, []),
        ([3], 4, 4, [[(0, 0, 3)]]),
        ([4], 4, 2, [[(0, 0, 4)]]),
        ([10], 4, 2, [[(0, 0, 4)], [(0, 4, 4)], [(0, 8, 2)]]),  # a large tensor alone, cut inside
        ([1, 1, 0, 3], 4, 4, [[(0, 0, 1), (1, 0, 1), (3, 0, 2)], [(3, 2, 1)]]),  # small ones packed, cut inside one
        ([1, 5, 1], 4, 2, [[(0, 0, 1)], [(1, 0, 4)], [(1, 4, 1)], [(2, 0, 1)]]),  # a large one between small ones
        ([5, 5], 4, 8, [[(0, 0, 4)], [(0, 4, 1), (1, 0, 3)], [(1, 3, 2)]]),  # all small: one flat stream
    ],
)
def test_plan_buckets_covers_every_byte_once_in_order(sizes, bucket, small, expected):
    from tmslurm.comm.transfer import plan_buckets

    plan = plan_buckets(sizes, bucket, small)
    assert plan == expected
    assert all(sum(n for _, _, n in b) <= bucket for b in plan)
    flat = [(i, off + k) for b in plan for i, off, n in b for k in range(n)]
    assert flat == [(i, k) for i, size in enumerate(sizes) for k in range(size)]
    assert all(len(b) == 1 for b in plan if any(sizes[i] >= small for i, _, _ in b))  # a large tensor is never staged


def test_own_tensors_leaves_out_shared_storage_and_what_needs_grad():
    import torch

    from tmslurm.comm.transfer import own_tensors

    w = torch.zeros(4)
    found = own_tensors(
        {"a": w, "b": w[:2], "c": torch.ones(2), "d": [torch.ones(1, requires_grad=True)], "e": torch.ones(4, 2).t()}
    )
    assert list(found) == [("c",)]


def test_own_tensors_keeps_disjoint_views_of_one_buffer():
    import torch

    from tmslurm.comm.transfer import own_tensors

    arena = torch.zeros(64)
    state = {
        "w": arena[0:16],
        "m": arena[16:48].view(4, 8),
        "tail": arena[40:64],
        "empty": arena[8:8],
        "x": torch.ones(3),
    }
    found = own_tensors(state)
    # m [16, 48) and tail [40, 64) share bytes: both left out; w, the empty view and x qualify
    assert sorted(found) == [("empty",), ("w",), ("x",)]
