"""The run's final hashes from every rank's ``done`` report: exactness you can check.

Contract: :func:`final_hashes` takes ``{rank: (shard, params digest, state digest)}`` and the number
of shards (``Layout.shards``: the stages when tp = 1) and returns the summary fields
``final_params_sha256`` (parameters of every shard), ``final_state_sha256`` (parameters and
optimizer state of every shard), ``stage_digests``, ``stage_state_digests`` (per shard, in shard
order; the names predate TP) and ``diverging`` (per shard whose data-parallel replicas disagree:
which ranks hold which digest; its ``stage`` key is the shard index), ``replicas_equal``. A missing
shard or a replica divergence gives ``None`` for both hashes: a run whose replicas differ never
looks equal to another run.

At ``parallel.zero=1`` each data-parallel rank reports the digest of its own optimizer slice and of
the buddy's copy it holds; :func:`fold_slices` first turns them into one state digest per shard
(sha256 over ``slice:digest`` in slice order, so a missing slice changes it). A rank whose buddy's
copy of its slice differs from its own keeps a digest of its own, so the shard diverges and no
final hash is given: the buddy copy is checked, not trusted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any


def final_hashes(reports: dict[int, tuple[int, str, str]], pp: int) -> dict[str, Any]:
    params: dict[int, dict[str, list[int]]] = {}
    states: dict[int, dict[str, list[int]]] = {}
    for rank, (stage, digest, state) in sorted(reports.items()):
        params.setdefault(stage, {}).setdefault(digest, []).append(rank)
        states.setdefault(stage, {}).setdefault(state, []).append(rank)
    complete = set(params) >= set(range(pp))
    diverging = [
        {"stage": j, "params": params[j], "state": states[j]}
        for j in sorted(params)
        if len(params[j]) > 1 or len(states[j]) > 1
    ]
    equal = complete and not diverging
    stage_digests = [next(iter(params[j])) for j in range(pp)] if equal else []
    stage_states = [next(iter(states[j])) for j in range(pp)] if equal else []
    return {
        "final_params_sha256": combine_digests(stage_digests) if equal else None,
        "final_state_sha256": combine_digests(stage_states) if equal else None,
        "stage_digests": stage_digests,
        "stage_state_digests": stage_states,
        "replicas_equal": not diverging,
        "diverging": diverging,
    }


def combine_digests(stage_digests: list[str]) -> str:
    """The run's ``final_params_sha256``: sha256 over the stage digests in stage order."""
    h = hashlib.sha256()
    for d in stage_digests:
        h.update(d.encode())
    return h.hexdigest()


def fold_slices(
    reports: dict[int, tuple[int, str, str, int | None, str | None]], buddy: Callable[[int], int]
) -> dict[int, tuple[int, str, str]]:
    """``{rank: (shard, params, own slice digest, slice, ward digest)}`` -> ``{rank: (shard, params, shard state)}``."""
    slices: dict[int, dict[int, str]] = {}
    for shard, _, state, index, _ in reports.values():
        slices.setdefault(shard, {})[-1 if index is None else index] = state
    out = {}
    for rank, (shard, params, state, _, _) in reports.items():
        combined = combine_digests([f"{k}:{d}" for k, d in sorted(slices[shard].items())])
        held = reports.get(buddy(rank))
        if held is not None and held[4] != state:
            combined = f"buddy copy differs: rank {rank} {state[:12]}, held {str(held[4])[:12]}"
        out[rank] = (shard, params, combined)
    return out
