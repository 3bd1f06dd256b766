"""Slurm hostlist expressions: expand ``n[01-03,7]`` into names and compress names back.

Contract: pure functions; the reference behaviour is Slurm's own ``scontrol show hostnames`` and
``scontrol show hostlist`` (recorded from 22.05, see tests/unit/test_slurm_parse.py). One deliberate
difference: text after a bracket group (``n[1-2]-ib``) is accepted, which 22.05 rejects. An invalid
expression raises :class:`~tmslurm.core.errors.SlurmParseError` quoting it; nothing else is raised.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tmslurm.core.errors import SlurmParseError


def expand_hostlist(expr: str) -> list[str]:
    """Expand ``n[01-03,7],x[1-2]y[3-4],plain`` into names, in order (duplicates kept).

    The width of a range is the length of its lower bound (``n[01-3]`` -> n01 n02 n03, ``n[1-03]``
    -> n1 n2 n3), as Slurm does. Empty items are skipped. Text after a bracket group is accepted
    (``n[1-2]-ib``), which Slurm 22.05 rejects. Raises SlurmParseError on unbalanced or nested
    brackets, non-numeric or descending ranges, or an empty group.
    """
    out: list[str] = []
    for item in _split_top_level(expr):
        out.extend(_expand_item(item))
    return out


def _split_top_level(expr: str) -> list[str]:
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise SlurmParseError(f"invalid hostlist {expr!r}: unbalanced or nested brackets")
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SlurmParseError(f"invalid hostlist {expr!r}: unterminated bracket")
    items.append("".join(cur).strip())
    return [i for i in items if i]


def _expand_item(item: str) -> list[str]:
    parts = re.split(r"(\[[^\[\]]*\])", item)
    choices = [_expand_group(p[1:-1], item) if p.startswith("[") else [p] for p in parts]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_group(body: str, item: str) -> list[str]:
    out: list[str] = []
    for rng in body.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", rng)
        if not m:
            raise SlurmParseError(f"invalid hostlist {item!r}: bad range {rng!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise SlurmParseError(f"invalid hostlist {item!r}: descending range {rng!r}")
        out.extend(f"{i:0{len(lo_s)}d}" for i in range(lo, hi + 1))
    return out


@dataclass
class _Run:
    prefix: str
    lo: int
    hi: int
    width: int  # zero-padding width; 0 = natural

    def text(self) -> str:
        lo = f"{self.lo:0{self.width}d}"
        return lo if self.lo == self.hi else f"{lo}-{self.hi:0{self.width}d}"


def compress_hostlist(names: Iterable[str]) -> str:
    """Compress names into a hostlist expression, keeping their order, like ``scontrol show hostlist``.

    Consecutive names with the same prefix and consecutive numbers of compatible zero-padding form
    a range; neighbouring ranges of one prefix share a bracket: ``n1,n3,n2`` -> ``n[1,3,2]``,
    ``n01,n02,n03,n07`` -> ``n[01-03,07]``, ``n1,a,n2`` -> ``n1,a,n2``. Names without trailing
    digits are kept as they are.
    """
    runs: list[_Run | str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if not m:
            runs.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        last = runs[-1] if runs else None
        if not (isinstance(last, _Run) and _extend(last, prefix, digits)):
            runs.append(_Run(prefix, int(digits), int(digits), _width(digits)))
    return ",".join(_render(group) for group in _group_runs(runs))


def _width(digits: str) -> int:
    return len(digits) if len(digits) > 1 and digits.startswith("0") else 0


def _extend(run: _Run, prefix: str, digits: str) -> bool:
    num = int(digits)
    if prefix != run.prefix or num != run.hi + 1:
        return False
    if f"{num:0{run.width}d}" != digits:  # n07 cannot follow n6, n8 cannot follow n007
        return False
    run.hi = num
    return True


def _group_runs(runs: list[_Run | str]) -> list[list[_Run] | str]:
    groups: list[list[_Run] | str] = []
    for run in runs:
        last = groups[-1] if groups else None
        if isinstance(run, _Run) and isinstance(last, list) and last[0].prefix == run.prefix:
            last.append(run)
        else:
            groups.append([run] if isinstance(run, _Run) else run)
    return groups


def _render(group: list[_Run] | str) -> str:
    if isinstance(group, str):
        return group
    if len(group) == 1 and group[0].lo == group[0].hi:
        return group[0].prefix + group[0].text()
    return f"{group[0].prefix}[{','.join(r.text() for r in group)}]"
