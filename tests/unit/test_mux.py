"""The node relay's framing and vote hold (pure): frames round-trip, bad frames are refused with
ProtocolError only, and the hold sends a node's votes as one frame without reordering anyone's lines."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.controller_harness import FakeRelay
from tmslurm.core.errors import ProtocolError
from tmslurm.wire.messages import BadMessage, Beat, Finish, decode_votes
from tmslurm.wire.mux import (
    Alive,
    Close,
    Deliver,
    Gone,
    Line,
    SubChannel,
    VoteHold,
    Votes,
    close_frame,
    deliver,
    is_vote,
    parse_down,
    parse_up,
    up_alive,
    up_gone,
    up_line,
    up_votes,
)
from tmslurm.wire.protocol import Channel, GateChannel, GateSide, LineChannel


def vote(rank: int, step: int = 5, epoch: int = 0, **extra) -> dict:
    return {
        "type": "vote",
        "step": step,
        "epoch": epoch,
        "rank": rank,
        "loss": 1.5,
        "dt": 0.1,
        "peak_rss_mb": 10.0,
        **extra,
    }


@pytest.mark.parametrize(
    "frame,expected",
    [
        (up_line(3, b'{"type":"hb"}'), Line(3, b'{"type":"hb"}\n')),
        (b'12 {"a": 1} x\n', Line(12, b'{"a": 1} x\n')),
        (up_gone(7), Gone(7)),
        (up_alive([1, 2, 9]), Alive((1, 2, 9))),
        (up_alive([]), Alive(())),
    ],
)
def test_up_frames(frame, expected):
    assert parse_up(frame) == expected


@pytest.mark.parametrize(
    "frame,expected",
    [
        (deliver([1, 4], b'{"type":"decision"}\n'), Deliver((1, 4), b'{"type":"decision"}\n')),
        (close_frame(5), Close(5)),
    ],
)
def test_down_frames(frame, expected):
    assert parse_down(frame) == expected


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\n",
        b"x",
        b"0 {}",
        b"-0",
        b"-x",
        b"+1,,2",
        b"+a",
        b"1",
        b"V ",
        b"V1",
        b"+1_0",
        b"- 1",
        b"99999999 {}",
        b"+0",
    ],
)
def test_bad_up_frames_are_protocol_errors(frame):
    with pytest.raises(ProtocolError):
        parse_up(frame)


@pytest.mark.parametrize("frame", [b"", b"{}", b"@", b"@ x", b"@1", b"!0", b"!", b"@1,x y", b"#1 x"])
def test_bad_down_frames_are_protocol_errors(frame):
    with pytest.raises(ProtocolError):
        parse_down(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_protocol_error_only(data):
    for parse in (parse_up, parse_down):
        try:
            parse(data)
        except ProtocolError:
            pass


def test_a_vote_frame_is_one_node_votes_by_column_in_the_subs_order():
    frame = parse_up(up_votes([2, 5], [vote(0, digest="d0"), vote(1)]))
    assert isinstance(frame, Votes) and frame.subs == (2, 5)
    nv = decode_votes(json.loads(frame.payload))
    assert [r.rank for r in nv.rows()] == [0, 1] and nv.rows()[0].digest == "d0" and nv.rows()[1].digest is None
    assert nv.step == 5 and nv.rows()[1].dt == 0.1


@pytest.mark.parametrize(
    "columns",
    [
        {"rank": [0, 1], "loss": [1.0], "dt": [0.1, 0.1], "peak_rss_mb": [1.0, 1.0], "digest": [None, None]},
        {"rank": [], "loss": [], "dt": [], "peak_rss_mb": [], "digest": []},
        {"rank": [0], "loss": [1.0], "dt": [-1.0], "peak_rss_mb": [1.0], "digest": [None]},
        {"rank": [True], "loss": [1.0], "dt": [0.1], "peak_rss_mb": [1.0], "digest": [None]},
    ],
)
def test_bad_node_votes_are_refused(columns):
    with pytest.raises(BadMessage):
        decode_votes({"type": "votes", "step": 1, "epoch": 0, **columns})


@pytest.mark.parametrize(
    "obj,ok",
    [
        (vote(0), True),
        (vote(0, digest="abc"), True),
        ({**vote(0), "loss": None}, True),
        ({**vote(0), "step": "5"}, False),
        ({**vote(0), "rank": True}, False),
        ({**vote(0), "dt": -0.5}, False),
        ({**vote(0), "dt": float("inf")}, False),
        ({**vote(0), "digest": ""}, False),
        ({**vote(0), "extra": 1}, False),
        ({k: v for k, v in vote(0).items() if k != "dt"}, False),
        ({**vote(0), "type": "progress"}, False),
        ([], False),
    ],
)
def test_only_votes_a_node_votes_accepts_are_aggregated(obj, ok):
    assert is_vote(obj) is ok


def test_the_hold_sends_a_node_votes_once_all_last_steps_voters_voted():
    hold = VoteHold(0.01)
    assert hold.vote(1, vote(0, step=0), 0.0) == [] and hold.vote(2, vote(1, step=0), 0.0) == []
    (first,) = hold.due(0.02)  # the first step has no voters to wait for: sent after hold_s
    assert parse_up(first).subs == (1, 2)
    assert hold.vote(2, vote(1, step=1), 1.0) == []  # sub 1 has not voted for step 1 yet
    (frame,) = hold.vote(1, vote(0, step=1), 1.0)  # complete: sent at once, in sub order
    assert parse_up(frame).subs == (1, 2) and hold.held == {}


def test_another_line_sends_the_held_votes_first():
    hold = VoteHold(1.0)
    for sub in (1, 2):
        hold.vote(sub, vote(sub, step=0), 0.0)
    hold.due(2.0)
    assert hold.vote(1, vote(1, step=1), 2.0) == []
    (frame,) = hold.other()
    assert parse_up(frame).subs == (1,) and hold.held == {}


def test_a_gone_voter_is_not_waited_for_and_a_new_step_or_epoch_flushes():
    hold = VoteHold(1.0)
    for sub in (1, 2):
        hold.vote(sub, vote(sub, step=0), 0.0)
    hold.due(2.0)
    assert hold.vote(1, vote(1, step=1), 2.0) == []
    (frame,) = hold.gone(2)
    assert parse_up(frame).subs == (1,)
    hold.vote(1, vote(1, step=3, epoch=1), 3.0)
    (old,) = hold.vote(1, vote(1, step=3, epoch=2), 3.0)  # the same sub again (a new epoch): the old one goes first
    assert json.loads(old.split(b" ", 1)[1])["epoch"] == 1


def test_every_channel_sends_through_one_implementation():
    """Channel, GateChannel and SubChannel implement only the line primitive; the model sends are LineChannel's."""
    for cls in (Channel, GateChannel, SubChannel):
        assert issubclass(cls, LineChannel)
        for name in ("send", "try_send", "try_send_line"):
            assert getattr(cls, name) is getattr(LineChannel, name), (cls.__name__, name)
    assert issubclass(GateChannel, GateSide) and issubclass(SubChannel, GateSide)
    assert SubChannel.send_now is GateChannel.send_now is GateSide.send_now


def test_a_sub_channel_sends_models_as_delivery_frames_and_refuses_after_close():
    relay = FakeRelay()
    ch = SubChannel(relay, 7)  # type: ignore[arg-type]
    assert ch.try_send(Beat()) and ch.send_now(Finish())
    ch.close()
    assert not ch.try_send(Beat())
    assert [parse_down(x) for x in relay.lines] == [
        Deliver((7,), b'{"type":"beat"}\n'),
        Deliver((7,), b'{"type":"finish"}\n'),
        Close(7),
    ]
