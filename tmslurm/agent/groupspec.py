"""What a prepare, recover or join tells an agent to build, and waiting for such a build.

Contract: :func:`groups_to_build` decodes a :class:`~tmslurm.wire.messages.Prepare`,
:class:`~tmslurm.wire.messages.Recover` or :class:`~tmslurm.wire.messages.Join` into what
:meth:`Fabric.build_in_background <tmslurm.comm.fabric.Fabric.build_in_background>` takes: the
generation of each named group, and the two-member transfer groups as ``{name: (generation, my
index)}`` (a join's one pair is its ``xfer`` group at the join's epoch, the joiner receiving as index
1). :func:`wait_built` waits for a background build while something may supersede it. Neither raises
(the build's own error comes out of its ``join``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tmslurm.comm.fabric import BackgroundBuild
from tmslurm.wire.messages import Join, Prepare, Recover


def groups_to_build(msg: Prepare | Recover | Join) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """The group generations and transfer pairs ``msg`` asks this agent to build."""
    gens = dict(msg.groups)
    if isinstance(msg, Join):
        return gens, {msg.xfer: (msg.epoch, 1)}
    return gens, {k: (v[0], v[1]) for k, v in msg.pairs.items()}


def wait_built(build: BackgroundBuild, given_up: Callable[[], bool]) -> bool:
    """Wait for ``build``, asking ``given_up`` every 10 ms; False as soon as it says so (the build then
    finishes unused in its thread)."""
    while not build.done():
        time.sleep(0.01)
        if given_up():
            return False
    return True
