"""Which local address reaches a given host (torch-free, so node monitors can use it too).

Contract: :func:`local_address_towards` returns the address of the interface that routes to
``host``; it sends nothing and raises :class:`~tmslurm.core.errors.CommError` when there is no route.
"""

from __future__ import annotations

import socket

from tmslurm.core.errors import CommError


def local_address_towards(host: str) -> str:
    """The local address this host uses to reach ``host`` (the rendezvous store's address).

    On a real cluster a node's name may resolve to an address of another network (or not resolve
    at all, as in the failure lab): gloo would then advertise an address its peers cannot reach,
    or fall back to loopback. The address of the interface that routes to the store is reachable
    by every peer that reaches the store. A UDP ``connect`` only consults the routing table; it
    sends nothing. ``GLOO_SOCKET_IFNAME``, when set, still wins (torch's own convention)."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))
        return probe.getsockname()[0]
    except OSError as exc:
        raise CommError(f"no route from this host to the rendezvous store at {host}: {exc}") from exc
    finally:
        probe.close()
