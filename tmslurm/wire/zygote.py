"""What the controller's spawner and an agent zygote share: the fork request and the command-line room.

Contract: the spawner (:mod:`tmslurm.controller.zygote_client`) writes one :class:`ForkRequest` as a JSON
line per agent to the zygote's standard input; the zygote (:mod:`tmslurm.agent.zygote`) validates
each line with it (unknown fields, wrong types and an empty ``argv`` are refused) and forks nothing
for a bad one. The zygote is started with :data:`CMDLINE_ROOM` bytes of padding on its command
line, so each agent it forks can rewrite its own command line to a fresh agent's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

CMDLINE_ROOM = 4096
"""Bytes of command line the spawner gives the zygote (a padding argument)."""


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    argv: Annotated[list[str], Field(min_length=1, max_length=32)]
    """Arguments of ``tmslurm.agent.main`` (``--run-dir D --rank R --node N``, ...)."""
    env: dict[str, str]
    """The agent's whole environment."""
    log: Annotated[str, Field(min_length=1)]
    """File its standard output and error are appended to."""
