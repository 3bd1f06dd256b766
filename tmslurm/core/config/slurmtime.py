"""The time rules of ``slurm.*``: Slurm time limits, the spares' renewal lead and the main job's signal lead.

Contract: :func:`time_minutes` reads an sbatch ``--time`` value into whole minutes (what is submitted);
:func:`spare_minutes` is a spare job's limit; :func:`validate_slurm_times` checks ``slurm.time``,
``slurm.spare_time``, ``slurm.spare_renew_s`` and ``slurm.signal_lead_s`` together, so that
``tmslurm-launch`` refuses them before it writes or submits anything. Pure: no Slurm call, no file.
Failure behaviour: :class:`~tmslurm.core.errors.ConfigError` naming every setting involved and the fix.
"""

from __future__ import annotations

import math

from tmslurm.core.config.schema import SlurmConfig
from tmslurm.core.errors import ConfigError

RENEW_S = 600
"""The renewal lead of a spare when slurm.spare_renew_s is not given (for limits of 2 x RENEW_S and more)."""

MIN_TRAIN_S = 60
"""Least time a main job trains before its signal lead begins. Slurm may send the signal up to 60 s
before ``--signal``'s lead, and sbatch counts ``--time`` in whole minutes: a job with less than a
minute before its lead can be told to stop as it starts, and checkpoint before a single step."""


def time_minutes(text: str, override: str = "slurm.time") -> int:
    """sbatch --time forms D-HH:MM:SS, HH:MM:SS, MM:SS, MM -> whole minutes (at least 1); a bad one is
    a ConfigError naming ``override``."""
    try:
        days, _, rest = text.rpartition("-")
        parts = [int(p) for p in rest.split(":")]
        if len(parts) > 3 or min(parts) < 0 or (days and int(days) < 0):
            raise ValueError(text)
        if len(parts) == 3:
            minutes = parts[0] * 60 + parts[1] + parts[2] / 60
        elif len(parts) == 2:
            minutes = parts[0] + parts[1] / 60
        else:
            minutes = parts[0]
        minutes += int(days) * 1440 if days else 0
    except ValueError:
        raise ConfigError(
            f"{override}={text!r} is not a Slurm time (D-HH:MM:SS, HH:MM:SS, MM:SS or MM). "
            f"Fix: pass {override}=00:30:00"
        ) from None
    return max(1, math.ceil(minutes))  # never shorter than asked


def spare_minutes(s: SlurmConfig) -> int:
    """A spare's time limit (``slurm.spare_time``, else ``slurm.time``) in minutes; ConfigError when a
    given ``slurm.spare_renew_s`` leaves no time between a spare's warm-up and its renewal."""
    override = "slurm.spare_time" if s.spare_time is not None else "slurm.time"
    minutes = time_minutes(s.spare_time or s.time, override)
    lead = s.spare_renew_s
    if lead is not None and not 60 <= lead <= minutes * 30:
        raise ConfigError(
            f"slurm.spare_renew_s={lead} must be at least 60 and at most half a spare's "
            f"time limit ({override}: {minutes} min), or every spare is renewed as soon as it starts. "
            f"Fix: pass slurm.spare_renew_s={max(60, min(RENEW_S, minutes * 30))}, a longer {override}, "
            "or leave slurm.spare_renew_s unset."
        )
    return minutes


def validate_slurm_times(s: SlurmConfig) -> None:
    """The time limits parse, the spares can be renewed, and the signal lead leaves the main job time
    to train: at least as long as the lead itself and at least :data:`MIN_TRAIN_S`."""
    limit_s = time_minutes(s.time) * 60
    spare_minutes(s)
    lead = s.signal_lead_s
    if not 10 <= lead <= 65535:
        raise ConfigError(
            f"slurm.signal_lead_s={lead} is outside 10..65535 (sbatch --signal's range, "
            "with room for a step and a checkpoint). Fix: pass slurm.signal_lead_s=120."
        )
    train_s = limit_s - lead
    if train_s < max(lead, MIN_TRAIN_S):
        need = math.ceil((lead + max(lead, MIN_TRAIN_S)) / 60)
        shorter = min(limit_s // 2, limit_s - MIN_TRAIN_S)
        raise ConfigError(
            f"slurm.signal_lead_s={lead} leaves the main job {max(train_s, 0)} s to train before it must "
            f"checkpoint and stop (slurm.time={s.time}: {limit_s} s); it needs at least the lead itself and "
            f"at least {MIN_TRAIN_S} s. Fix: pass slurm.time={need // 60:02d}:{need % 60:02d}:00 or longer"
            + (f", or slurm.signal_lead_s={shorter} or less." if shorter >= 10 else ".")
        )
