"""The controller's endpoints: the control port (agents, CLI, admin) and the rendezvous store.

Contract: :meth:`ControlServer.open` binds both on ``host`` (the job's own address: loopback for
``cluster=local``, the batch host's address on Slurm) at ephemeral ports; :attr:`address` is what
``controller.json`` advertises. The TCPStore holds only group rendezvous keys (``<group
name>/g<generation>/...``: ranks, addresses, barrier counters); it carries no token, no config
and no tensors, and nothing read from it is ever unpickled. :meth:`serve` starts the
:class:`~tmslurm.runtime.gate.Gate` feeding the controller's queue; :meth:`close` stops both.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

from tmslurm.runtime.gate import Gate, GateLimits
from tmslurm.runtime.journal import Journal
from tmslurm.signing import NoticeVerifier


@dataclass
class ControlServer:
    store: Any
    sock: socket.socket
    host: str
    gate: Gate | None = None

    @classmethod
    def open(cls, host: str) -> "ControlServer":
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, use_libuv=True)
        return cls(store, socket.create_server((host, 0)), host)

    @property
    def address(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.sock.getsockname()[1], "store_port": self.store.port}

    def serve(self, token: str, verifier: NoticeVerifier | None, journal: Journal,
              submit: Callable[[tuple[str, Any, Any]], None], touch: Callable[[int], None]) -> None:
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
