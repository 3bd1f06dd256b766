"""Log format of every tmslurm process: one line with the run, who (rank or standby) and the step.

Contract: :func:`setup_logging` installs one stderr handler on the root logger (only entry points
call it, never a library module); :data:`LOG_CONTEXT` holds the fields the lines carry, updated
by the agent as it goes. Nothing here raises.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOG_CONTEXT: dict[str, Any] = {"run": "-", "who": "-", "step": "-"}


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.run, record.who, record.step = LOG_CONTEXT["run"], LOG_CONTEXT["who"], LOG_CONTEXT["step"]
        return True


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [run=%(run)s %(who)s step=%(step)s] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
