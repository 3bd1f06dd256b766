"""The controller's endpoints: the control port (agents, CLI, admin) and the rendezvous store.

Contract: :meth:`ControlServer.open` binds both on ``host`` (the job's own address: loopback for
``cluster=local``, the batch host's address on Slurm) at ephemeral ports; :meth:`ControlServer.inherit`
serves instead on a listening socket and store that a supervisor opened and keeps across
controller restarts (so a restarted controller listens at the same address); :attr:`address` is what
``controller.json`` advertises. The TCPStore holds only group rendezvous keys (``<group
name>/g<generation>/...``: ranks, addresses, barrier counters); it carries no token, no config
and no tensors, and nothing read from it is ever unpickled. :meth:`serve` starts the
:class:`~tmslurm.controller.gate.Gate` feeding the controller's queue; :meth:`close` stops both.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tmslurm.controller.gate import Gate
from tmslurm.controller.gateauth import GateLimits
from tmslurm.controller.items import Item
from tmslurm.controller.journal import Journal
from tmslurm.core.signing import NoticeVerifier


@dataclass
class ControlServer:
    store: Any
    """The TCPStore when this process hosts it; None when a supervisor does (see :meth:`inherit`)."""
    store_port: int
    sock: socket.socket
    host: str
    gate: Gate | None = None

    @classmethod
    def open(cls, host: str) -> ControlServer:
        store = open_store(host)
        return cls(store, store.port, socket.create_server((host, 0)), host)

    @classmethod
    def inherit(cls, host: str, listen_fd: int, store_port: int) -> ControlServer:
        """Serve on a listening socket a supervisor holds (and keeps across controller restarts)."""
        return cls(None, store_port, socket.socket(fileno=listen_fd), host)

    @property
    def address(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.sock.getsockname()[1], "store_port": self.store_port}

    def serve(
        self,
        token: str,
        verifier: NoticeVerifier | None,
        journal: Journal,
        submit: Callable[[Item], None],
        touch: Callable[[int], None],
    ) -> None:
        self.gate = Gate(self.sock, token, verifier, journal, submit, touch, GateLimits())
        self.gate.start()

    def close_requests(self, why: str) -> None:
        """Answer further one-shot requests with an error (the run is ending)."""
        if self.gate is not None:
            self.gate.close_requests(why)

    def close(self) -> None:
        if self.gate is not None:
            self.gate.stop()
        else:
            self.sock.close()


def open_store(host: str) -> Any:
    """The run's rendezvous store (group keys only), on an ephemeral port of ``host``."""
    import torch.distributed as dist  # here: a controller that only serves never imports torch

    return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, use_libuv=True)
