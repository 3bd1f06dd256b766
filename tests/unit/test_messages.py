"""Typed messages at the boundary, signed notices, final hashes, the transfer header, trusted runs."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tmslurm.comm.transfer import _parse_header, _split
from tmslurm.errors import CommError
from tmslurm.wire.messages import BadMessage, Decision, NoticeRequest, Vote, decode_agent, decode_controller, decode_first
from tmslurm.notify import trusted_run
from tmslurm.controller.final import final_hashes
from tmslurm.signing import NoticeRefused, NoticeVerifier, generate_keypair, load_private_key, load_public_key, signed_notice
from tmslurm.train.schedule import state_digest

VOTE = {"type": "vote", "step": 3, "epoch": 1, "rank": 0, "loss": 2.5, "dt": 0.01, "peak_rss_mb": 100.0}


@pytest.mark.parametrize("bad,where", [
    ({"type": "notice", "token": "t", "event": "maintenance", "node": ["a"]}, "notice.node"),
    ({"type": "hello", "token": "t", "kind": "worker", "id": 1, "pid": "1", "node": "n"}, "hello.pid"),
    ({"type": "hello", "token": "t", "kind": "worker", "id": True, "node": "n"}, "hello.id"),
    ({"type": "notice", "token": "t", "event": "explode", "rank": 1}, "notice.event"),
    ({"type": "stop", "token": "t", "extra": 1}, "stop.extra"),
    ({"type": "vote", "token": "t"}, "expected tags"),
    ({"type": 7}, "expected tags|valid string"),
])
def test_bad_first_messages_name_the_field(bad, where):
    with pytest.raises(BadMessage, match=where):
        decode_first(bad)


@pytest.mark.parametrize("change", [{"rank": -1}, {"step": 2**40}, {"dt": float("inf")}, {"epoch": "1"}, {"x": 1},
                                    {"type": "left"}, {"digest": ""}, {"peak_rss_mb": None}])
def test_bad_agent_messages_are_refused(change):
    with pytest.raises(BadMessage):
        decode_agent({**VOTE, **change})


def test_valid_messages_decode_to_their_type_and_round_trip():
    vote = decode_agent(VOTE)
    assert isinstance(vote, Vote) and vote.rank == 0 and vote.digest is None
    d = decode_controller(json.loads(json.dumps(Decision(step=3, epoch=1, final=True).model_dump(mode="json"))))
    assert isinstance(d, Decision) and d.final and d.switch is None
    assert isinstance(decode_first({"type": "notice", "token": "t", "event": "failure", "rank": 2}), NoticeRequest)


@pytest.mark.parametrize("junk", [None, [], "x", 3, {"type": None}, {"type": "vote" * 1000}, {"type": "vote", **{f"k{i}": i for i in range(500)}}])
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
    cases = [(good, "replayed"), (signed_notice(other, "run1", "node4", "maintenance"), "bad signature"),
             (signed_notice(key, "run1", "node4", "failure", now=time.time() - 120), "stale"),
             (signed_notice(key, "run2", "node4", "failure"), "signed for run"),
             (good.model_copy(update={"payload": good.payload.model_copy(update={"node": "node5"})}), "bad signature"),
             (good.model_copy(update={"signature": "!!notbase64"}), "bad signature")]
    for notice, why in cases:
        with pytest.raises(NoticeRefused, match=why):
            v.verify(notice)


def test_final_hashes_equal_replicas_divergence_and_missing_stage():
    ok = final_hashes({0: (0, "a", "sa"), 2: (0, "a", "sa"), 1: (1, "b", "sb"), 3: (1, "b", "sb")}, pp=2)
    assert ok["replicas_equal"] and ok["final_params_sha256"] and ok["final_state_sha256"] and ok["diverging"] == []
    moments = final_hashes({0: (0, "a", "sa"), 2: (0, "a", "sX"), 1: (1, "b", "sb"), 3: (1, "b", "sb")}, pp=2)
    assert moments["final_params_sha256"] is None and moments["final_state_sha256"] is None
    assert moments["replicas_equal"] is False and moments["diverging"] == [
        {"stage": 0, "params": {"a": [0, 2]}, "state": {"sa": [0], "sX": [2]}}]
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
    state = {"model": {"w": torch.ones(2, 3)}, "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"betas": (0.9, 0.99), "params": [0]}]}}
    header = json.dumps({"n": 2, "s": _split(state, tensors)}).encode()
    skeleton, placed = _parse_header(header)
    assert list(skeleton["optim"]["state"]) == [0] and skeleton["optim"]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert [t.shape for t in placed] == [torch.Size([2, 3]), torch.Size([])]
    for bad in [b"\x80\x04\x95pickle", b'{"n": 1, "s": {"t": 0, "shape": [2], "dtype": "object"}}',
                b'{"n": 0, "s": {"__reduce__": 1}}', b'{"n": 1, "s": []}', b"[" * 100000]:
        with pytest.raises(CommError):
            _parse_header(bad)
    with pytest.raises(CommError):
        _split({"x": object()}, [])


def test_trusted_run_checks_owner_and_modes(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "controller.json").write_text("{}")
    (run / "token").write_text("t")
    os.chmod(run / "controller.json", 0o644)
    assert trusted_run(run, with_token=True) is None
    os.chmod(run / "controller.json", 0o666)
    assert "writable by others" in trusted_run(run, with_token=False)
    os.chmod(run / "controller.json", 0o644)
    (run / "token").unlink()
    (run / "token").symlink_to(run / "controller.json")
    assert "plain file" in trusted_run(run, with_token=True)
    assert "cannot inspect" in trusted_run(tmp_path / "nope", with_token=False)
