"""An agent's connection to the controller: hello, the reader and heartbeat threads, the abort flag.

Contract: :func:`hello` connects to the controller named in ``<run_dir>/controller.json``,
authenticates with the run token and returns the :class:`Link` and the validated ``welcome``
(TmslurmError when refused). The reader thread validates every controller message
(:func:`~tmslurm.messages.decode_controller`; a bad one is logged and dropped), queues it, and
raises the abort flag the moment an ``abort`` arrives, so a rank blocked in a collective stops
waiting. When the controller goes away, :meth:`Link.get` runs the ``before_exit`` callbacks (a worker
finishes its in-flight checkpoint there; a callback's error is logged) and ends the process
(status 3): a rank never trains on without its controller.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tmslurm.errors import ProtocolError, TmslurmError
from tmslurm.messages import Abort, BadMessage, Welcome, decode_controller
from tmslurm.runtime.protocol import Channel, connect, controller_address, read_token

log = logging.getLogger(__name__)
LOST = object()
"""Put in the inbox when the controller's connection closed."""


@dataclass
class Link:
    """The agent's connection to the controller: channel, inbox and abort flag."""

    channel: Channel
    heartbeat_s: float
    inbox: "queue.Queue[Any]" = field(default_factory=queue.Queue)
    """Typed controller messages (:data:`~tmslurm.messages.ControllerMessage`), or :data:`LOST`."""
    abort_event: threading.Event = field(default_factory=threading.Event)
    abort_epoch: int = -1
    lost: threading.Event = field(default_factory=threading.Event)
    abort_lock: threading.Lock = field(default_factory=threading.Lock)
    before_exit: list[Callable[[], Any]] = field(default_factory=list)
    """Called, in order, before a lost controller ends the process."""

    def start(self) -> None:
        threading.Thread(target=self._read, name="ctl-reader", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def send(self, msg: dict[str, Any]) -> None:
        if not self.channel.try_send(msg):
            self.lost.set()

    def _read(self) -> None:
        while True:
            try:
                msg = self.channel.recv()
            except ProtocolError as exc:
                log.error("bad message from controller: %s", exc)
                continue
            if msg is None:
                self.lost.set()
                self.abort_event.set()
                self.inbox.put(LOST)
                return
            try:
                typed = decode_controller(msg)
            except BadMessage as exc:
                log.error("ignoring a bad message from the controller: %s", exc)
                continue
            if isinstance(typed, Abort):
                with self.abort_lock:
                    self.abort_epoch = max(self.abort_epoch, typed.epoch)
                    self.abort_event.set()
            self.inbox.put(typed)

    def _beat(self) -> None:
        if self.heartbeat_s <= 0:
            return
        while not self.lost.is_set():
            self.send({"type": "hb"})
            time.sleep(self.heartbeat_s)

    def get(self, timeout: float | None = None) -> Any:
        """Next controller message (typed); a lost controller ends the process."""
        msg = self.inbox.get(timeout=timeout)
        if msg is LOST:
            log.error("lost the controller; exiting")
            self._run_before_exit()
            os._exit(3)
        return msg

    def _run_before_exit(self) -> None:
        for fn in self.before_exit:
            try:
                fn()
            except Exception as exc:  # the process ends anyway: say what was lost
                log.error("before exit: %s: %s", type(exc).__name__, exc)

    def clear_abort(self, epoch: int) -> None:
        with self.abort_lock:
            if self.abort_epoch <= epoch:
                self.abort_event.clear()


def hello(run_dir: Path, kind: str, ident: int, node: str) -> tuple[Link, Welcome]:
    addr = controller_address(run_dir)
    ch = connect(addr["host"], addr["port"], timeout_s=30.0)
    ch.send({"type": "hello", "token": read_token(run_dir), "kind": kind, "id": ident, "pid": os.getpid(), "node": node,
             "host": socket.gethostname()})
    reply = ch.recv()
    if reply is None or reply.get("type") != "welcome":
        raise TmslurmError(f"controller refused {kind} {ident}: {reply}")
    welcome = decode_controller(reply)
    cfg = welcome.config
    link = Link(ch, float(cfg["runtime"]["heartbeat_interval_s"]) if cfg["runtime"].get("heartbeats", True) else 0.0)
    link.start()
    return link, welcome


def node_name(arg: str | None) -> str:
    return arg or os.environ.get("TMSLURM_NODE") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
