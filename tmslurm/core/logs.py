"""Log format of every tmslurm process: one line with the run, who (rank or standby) and the step.

Contract: :func:`setup_logging` installs one stderr handler on the root logger (only entry points
call it, never a library module); :data:`LOG_CONTEXT` holds the fields the lines carry, updated
by the agent as it goes. A field may be a callable, read at each line: the controller and the
supervisor, which do not step themselves, give the step they know that way. A callable that
raises gives ``?``. Nothing here raises.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOG_CONTEXT: dict[str, Any] = {"run": "-", "who": "-", "step": "-"}


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.run, record.who, record.step = (_value(LOG_CONTEXT[k]) for k in ("run", "who", "step"))
        return True


def _value(field: Any) -> Any:
    if not callable(field):
        return field
    try:
        return field()
    except Exception:  # a log line must never fail for its context
        return "?"


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s [run=%(run)s %(who)s step=%(step)s] %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
