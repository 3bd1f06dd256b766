"""An agent's connection to the controller: hello, the reader and heartbeat threads, the abort flag.

Contract: :func:`hello` connects to the controller named in ``<run_dir>/controller.json``,
authenticates with the run token and returns the :class:`Link` and the validated ``welcome``
(TmslurmError when refused). The reader thread validates every controller message
(:func:`~tmslurm.messages.decode_controller`; a bad one is logged and dropped), queues it, and
raises the abort flag the moment an ``abort`` arrives, so a rank blocked in a collective stops
waiting. ``beat`` messages only prove the controller alive and are not queued. When the controller
goes away, :meth:`Link.get` runs the ``before_exit`` callbacks (a worker finishes its in-flight
checkpoint there; a callback's error is logged) and ends the process (status 3): a rank never
trains on without its controller. The watchdog thread ends it too (after ``on_lost`` and the same
callbacks), whatever the training thread is doing: when the connection closed and the process has
not exited :data:`LOST_GRACE_S` later, or when nothing at all came from the controller for
``runtime.controller_lost_s`` (a silent controller host sends no FIN).
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
from tmslurm.messages import Abort, BadMessage, Beat, Welcome, decode_controller
from tmslurm.runtime.protocol import Channel, connect, controller_address, read_token

log = logging.getLogger(__name__)
LOST = object()
"""Put in the inbox when the controller's connection closed."""
LOST_GRACE_S = 2.0
"""After the connection closed, the training thread gets this long to exit on its own."""


@dataclass
class Link:
    """The agent's connection to the controller: channel, inbox and abort flag."""

    channel: Channel
    heartbeat_s: float
    controller_lost_s: float
    """Exit when nothing came from the controller for this long (0: never)."""
    inbox: "queue.Queue[Any]" = field(default_factory=queue.Queue)
    """Typed controller messages (:data:`~tmslurm.messages.ControllerMessage`), or :data:`LOST`."""
    abort_event: threading.Event = field(default_factory=threading.Event)
    abort_epoch: int = -1
    lost: threading.Event = field(default_factory=threading.Event)
    abort_lock: threading.Lock = field(default_factory=threading.Lock)
    heard_m: float = field(default_factory=time.monotonic)
    """When the last line came from the controller (monotonic)."""
    on_lost: Callable[[str], None] | None = None
    """Called (with why) by the watchdog just before it ends the process for a lost controller."""
    before_exit: list[Callable[[], Any]] = field(default_factory=list)
    """Called, in order, before a lost controller ends the process."""

    def start(self) -> None:
        threading.Thread(target=self._read, name="ctl-reader", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._watch, name="ctl-watchdog", daemon=True).start()

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
            self.heard_m = time.monotonic()
            try:
                typed = decode_controller(msg)
            except BadMessage as exc:
                log.error("ignoring a bad message from the controller: %s", exc)
                continue
            if isinstance(typed, Beat):
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

    def _watch(self) -> None:
        while True:
            if self.lost.wait(timeout=0.5):
                if self.on_lost is None:
                    time.sleep(LOST_GRACE_S)  # the training thread normally exits through get() first
                self._exit("the controller's connection closed")
            silent = time.monotonic() - self.heard_m
            if self.controller_lost_s and silent > self.controller_lost_s:
                self._exit(f"heard nothing from the controller for {silent:.1f}s "
                           f"(runtime.controller_lost_s={self.controller_lost_s:g})")

    def _exit(self, why: str) -> None:
        log.error("lost the controller (%s); exiting", why)
        if self.on_lost is not None:
            try:
                self.on_lost(why)
            except Exception:  # the exit must happen whatever the action did
                log.exception("the lost-controller action failed")
        self._run_before_exit()
        os._exit(3)

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


def hello(run_dir: Path, kind: str, ident: int, node: str,
          on_lost: Callable[[str], None] | None = None) -> tuple[Link, Welcome]:
    addr = controller_address(run_dir)
    ch = connect(addr["host"], addr["port"], timeout_s=30.0)
    ch.send({"type": "hello", "token": read_token(run_dir), "kind": kind, "id": ident, "pid": os.getpid(), "node": node,
             "host": socket.gethostname()})
    reply = ch.recv()
    if reply is None or reply.get("type") != "welcome":
        raise TmslurmError(f"controller refused {kind} {ident}: {reply}")
    welcome = decode_controller(reply)
    cfg = welcome.config
    rt = cfg["runtime"]
    beat_s = float(rt["monitor_interval_s"] if kind == "monitor" else rt["heartbeat_interval_s"])
    link = Link(ch, beat_s if rt.get("heartbeats", True) else 0.0, float(rt["controller_lost_s"]), on_lost=on_lost)
    link.start()
    return link, welcome


def node_name(arg: str | None) -> str:
    return arg or os.environ.get("TMSLURM_NODE") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
