"""Tests of tmslurm.core.notices: validation, deadline forms, JSON round trip."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone

import pytest

from tmslurm.core.errors import NoticeError
from tmslurm.core.notices import KINDS, SOURCES, Notice, parse_deadline

NOW = 1_800_000_000.0


def notice(**overrides) -> Notice:
    fields = {"kind": "maintenance", "node": "tmn2", "source": "slurm", "time": NOW}
    return Notice(**{**fields, **overrides})


@pytest.mark.parametrize(
    "text,expected",
    [
        ("now", NOW),
        (" NOW ", NOW),
        ("+90s", NOW + 90),
        ("+5m", NOW + 300),
        ("+1h", NOW + 3600),
        ("+1.5h", NOW + 5400),
        ("+0s", NOW),
        ("2026-12-02T12:00:00", datetime(2026, 12, 2, 12).timestamp()),  # local time
        ("2026-12-02T12:00:00+01:00", datetime(2026, 12, 2, 11, tzinfo=timezone.utc).timestamp()),
        ("2026-12-02T12:00:00Z", datetime(2026, 12, 2, 12, tzinfo=timezone.utc).timestamp()),
        ("1796212800", 1796212800.0),
        ("1796212800.5", 1796212800.5),
        (1796212800, 1796212800.0),
        (1796212800.25, 1796212800.25),
        (None, None),
    ],
)
def test_parse_deadline_forms(text, expected):
    assert parse_deadline(text, NOW) == expected


@pytest.mark.parametrize(
    "text",
    [
        "tomorrow",
        "+5d",
        "+-5m",
        "-5",
        "",
        "+",
        "5m",
        "nan",
        "inf",
        "2026-13-02T00:00:00",
        "12:00",
        True,
        [],
        float("nan"),
        -1,
        float("inf"),
    ],
)
def test_parse_deadline_rejects_and_lists_forms(text):
    with pytest.raises(NoticeError) as info:
        parse_deadline(text, NOW)
    message = str(info.value)
    assert "bad deadline" in message
    for form in ("ISO-8601", "'now'", "+5m", "epoch seconds"):
        assert form in message


@pytest.mark.parametrize(
    "n",
    [
        notice(),
        notice(kind="failure", deadline=None, reason="Not responding", slurm_state="DOWN+NOT_RESPONDING", role="spare"),
        notice(node=None, rank=3, source="worker", kind="failure", reason="connection closed by peer"),
        notice(rank=0, source="fault", deadline=NOW + 60.5),
        notice(source="admin", reason="firmware upgrade", deadline=NOW + 600, role="main"),
    ],
)
def test_json_round_trip(n):
    text = n.to_json()
    assert json.loads(text)["kind"] == n.kind
    assert Notice.from_json(text) == n
    assert Notice.from_json(json.loads(text)) == n
    assert Notice.from_json(text.encode()) == n


def test_notice_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        notice().kind = "failure"
    assert notice().planned and not notice(kind="failure").planned


def test_unknown_kind_lists_valid_ones():
    with pytest.raises(NoticeError) as info:
        notice(kind="reboot")
    assert "reboot" in str(info.value)
    for kind in KINDS:
        assert kind in str(info.value)


def test_unknown_source_lists_valid_ones():
    with pytest.raises(NoticeError) as info:
        notice(source="oracle")
    for source in SOURCES:
        assert source in str(info.value)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"node": None}, "node or a rank"),
        ({"node": ""}, "node must be"),
        ({"rank": -1}, "rank must be"),
        ({"rank": True}, "rank must be"),
        ({"rank": "3"}, "rank must be"),
        ({"deadline": -5.0}, "bad deadline"),
        ({"deadline": float("nan")}, "bad deadline"),
        ({"deadline": "+5m"}, "bad deadline"),  # strings only through from_json/parse_deadline
        ({"time": None}, "time must be"),
        ({"role": "standby"}, "role"),
        ({"reason": None}, "reason must be"),
    ],
)
def test_invalid_notice(overrides, match):
    with pytest.raises(NoticeError, match=match):
        notice(**overrides)


def test_from_json_defaults_and_deadline_strings():
    n = Notice.from_json('{"kind": "maintenance", "node": "tn1", "source": "admin", "deadline": "+5m"}', now=NOW)
    assert (n.time, n.deadline, n.reason, n.slurm_state, n.rank) == (NOW, NOW + 300, "", "", None)
    n = Notice.from_json({"kind": "failure", "rank": 2, "source": "worker", "time": NOW - 10, "deadline": "now"})
    assert n.deadline == NOW - 10  # relative forms count from the notice's own time


@pytest.mark.parametrize(
    "data,match",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"kind": "maintenance", "node": "n1"}', "lacks 'source'"),
        ('{"node": "n1", "source": "admin"}', "lacks 'kind'"),
        ('{"kind": "maintenance", "node": "n1", "source": "admin", "colour": "red"}', "unknown notice field"),
        ('{"kind": "maintenance", "node": "n1", "source": "admin", "deadline": "soonish"}', "bad deadline"),
        ('{"kind": "maintenance", "node": "n1", "source": "admin", "deadline": [1]}', "bad deadline"),
        ('{"kind": "maintenance", "source": "admin"}', "node or a rank"),
        ('{"kind": "maintenance", "node": "n1", "source": "admin", "time": "noon"}', "time must be"),
    ],
)
def test_from_json_rejects(data, match):
    with pytest.raises(NoticeError, match=match):
        Notice.from_json(data, now=NOW)


def test_iso_deadline_with_offset_is_absolute():
    east = datetime(2026, 12, 2, 12, tzinfo=timezone(timedelta(hours=5)))
    assert parse_deadline(east.isoformat(), NOW) == east.timestamp()
