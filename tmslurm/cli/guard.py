"""How a command-line entry point ends on a deliberate error: one ``error:`` line, no traceback.

Contract: :func:`guarded` runs an entry point's body and returns its exit status; a
:class:`~tmslurm.core.errors.TmslurmError` it raises is printed as ``error: <message>`` on stderr and
exits with ``status_of(error)`` (:data:`USAGE_ERROR` unless the command tells errors apart). A
reader that went away (``tmslurm-launch --help | head``) ends the command quietly with status 0. Any
other exception propagates (a bug shows its traceback).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tmslurm.core.errors import TmslurmError

USAGE_ERROR = 2
"""The exit status of a deliberate error (a bad override, a missing file, a refusal)."""


def guarded(body: Callable[[], int], status_of: Callable[[TmslurmError], int] = lambda _exc: USAGE_ERROR) -> int:
    try:
        return body()
    except TmslurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return status_of(exc)
    except BrokenPipeError:  # stdout's reader is gone: nothing left to tell it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 0
