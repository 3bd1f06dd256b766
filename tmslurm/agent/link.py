"""An agent's connection to the controller: hello, the reader and heartbeat threads, the abort flag.

Contract: :func:`hello` connects to the controller named in ``<run_dir>/controller.json``,
authenticates with the run token and returns the :class:`Link` and the validated ``welcome``
(TmslurmError when refused). The reader thread validates every controller message
(:func:`~tmslurm.wire.messages.decode_controller`; a bad one is logged and dropped), queues it, and
raises the abort flag the moment an ``abort`` arrives, so a rank blocked in a collective stops
waiting. ``beat`` messages only prove the controller alive and are not queued. When the controller
goes away, :meth:`Link.get` runs the ``before_exit`` callbacks (a worker finishes its in-flight
checkpoint there; a callback's error is logged) and ends the process (status 3): a rank never
trains on without its controller. The watchdog thread ends it too (after ``on_lost`` and the same
callbacks), whatever the training thread is doing: when the connection closed and the process has
not exited :data:`LOST_GRACE_S` later, or when nothing at all came from the controller for
``runtime.controller_lost_s`` (a silent controller host sends no FIN).

Surviving a controller restart (``runtime.controller_restarts`` > 0: a supervisor, locally and
on Slurm, restarts a controller that died): when the connection closes, the reader thread does
not give up but reconnects (backoff 0.05 s doubling to 1 s, the address re-read from
``controller.json``) until ``runtime.controller_lost_s`` has passed. Its hello carries a
:class:`~tmslurm.wire.messages.Rejoin` (the slot it serves, its epoch, the last decision it received,
its vote still waiting for a decision, whether it is inside a plan), then the sticky messages
(``ready``, ``done``) are sent again and the ``on_reconnect`` callbacks run. Sends while the
controller is away wait for the reconnect (they hold no lock the reader needs) or are dropped;
the vote is never lost, as it travels in the rejoin. A refused rejoin, or no controller within
``runtime.controller_lost_s``, ends the process as above.

With ``runtime.relay`` (``controller.json`` says ``relay``), a worker or standby connects to its
node's relay (:mod:`tmslurm.agent.relay`, a local socket) instead of the controller's address;
the relay carries its lines unchanged, so everything above holds as it is.

Everything an agent sends is a :mod:`tmslurm.wire.messages` model (:meth:`Link.send` takes nothing
else): the hello, the rejoin, the heartbeat and every report.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tmslurm.agent.relay import connect_local
from tmslurm.core.errors import ProtocolError, TmslurmError
from tmslurm.wire.messages import (
    Abort,
    AgentKind,
    BadMessage,
    Beat,
    Decision,
    Done,
    Heartbeat,
    Hello,
    Msg,
    Ready,
    Rejoin,
    Vote,
    Welcome,
    decode_controller,
)
from tmslurm.wire.protocol import Channel, connect, controller_address, read_token

log = logging.getLogger(__name__)
LOST = object()
"""Put in the inbox when the controller's connection closed."""
LOST_GRACE_S = 2.0
"""After the connection closed, the training thread gets this long to exit on its own."""
STICKY = (Ready, Done)
"""Messages sent again after a reconnect: the restarted controller needs them and cannot ask."""
HEARTBEAT = Heartbeat()


@dataclass
class Link:
    """The agent's connection to the controller: channel, inbox and abort flag."""

    channel: Channel
    heartbeat_s: float
    controller_lost_s: float
    """Exit when nothing came from the controller for this long (0: never)."""
    inbox: queue.Queue[Any] = field(default_factory=queue.Queue)
    """Typed controller messages (:data:`~tmslurm.wire.messages.ControllerMessage`), or :data:`LOST`."""
    abort_event: threading.Event = field(default_factory=threading.Event)
    abort_epoch: int = -1
    lost: threading.Event = field(default_factory=threading.Event)
    abort_lock: threading.Lock = field(default_factory=threading.Lock)
    heard_m: float = field(default_factory=time.monotonic)
    """When the last line came from the controller (monotonic)."""
    sent_m: float = field(default_factory=time.monotonic)
    """When this agent last sent a line (monotonic; its hello just before the link was made): any
    line proves it alive, so a heartbeat is only sent after ``heartbeat_s`` without one."""
    on_lost: Callable[[str], object] | None = None
    """Called (with why) by the watchdog just before it ends the process for a lost controller."""
    before_exit: list[Callable[[], Any]] = field(default_factory=list)
    """Called, in order, before a lost controller ends the process."""
    rejoin: Rejoiner | None = None
    """How to reconnect to a restarted controller; None: a lost controller ends the process."""
    rejoin_state: Callable[[], dict[str, Any]] | None = None
    """The agent's ``rank``, ``epoch``, ``in_plan``, ``prepared`` and ``aborting`` for a rejoin
    (set by the worker or standby)."""
    on_reconnect: list[Callable[[], Any]] = field(default_factory=list)
    """Called after a reconnect (a monitor forgets its watches; the controller names them again)."""
    last_decision: Decision | None = None
    pending_vote: Vote | None = None
    sticky: list[Msg] = field(default_factory=list)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by a send and by a whole reconnect attempt, so nothing is sent into the gap."""

    def start(self) -> None:
        threading.Thread(target=self._read, name="ctl-reader", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._watch, name="ctl-watchdog", daemon=True).start()

    def send(self, msg: Msg) -> None:
        with self.send_lock:
            if isinstance(msg, Vote):
                self.pending_vote = msg
            elif isinstance(msg, STICKY):
                self.sticky.append(msg)
            if self.channel.try_send(msg):
                self.sent_m = time.monotonic()
            elif self.rejoin is None:
                self.lost.set()

    def _read(self) -> None:
        while True:
            try:
                msg = self.channel.recv()
            except ProtocolError as exc:
                log.error("bad message from controller: %s", exc)
                continue
            if msg is None:
                if self.rejoin is not None and self._reconnect():
                    continue
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
            self._track(typed)
            self.inbox.put(typed)

    def _track(self, typed: Any) -> None:
        if isinstance(typed, Abort):
            with self.abort_lock:
                self.abort_epoch = max(self.abort_epoch, typed.epoch)
                self.abort_event.set()
        if isinstance(typed, (Decision, Abort)):
            with self.send_lock:
                if isinstance(typed, Decision):
                    self.last_decision = typed
                vote = self.pending_vote
                if vote is not None and (isinstance(typed, Abort) or vote.step <= typed.step):
                    self.pending_vote = None

    def _reconnect(self) -> bool:
        """Rejoin a restarted controller within ``controller_lost_s``; False when none took us back."""
        assert self.rejoin is not None
        lost_m = self.heard_m = time.monotonic()  # the watchdog's silence counts from the loss too
        log.warning("the controller's connection closed; reconnecting for up to %.0fs", self.controller_lost_s)
        pause = 0.05
        while time.monotonic() - lost_m < self.controller_lost_s:
            with self.send_lock:
                state = self.rejoin_state() if self.rejoin_state is not None else {}
                rejoin = Rejoin(
                    rank=state.get("rank"),
                    epoch=state.get("epoch", 0),
                    in_plan=bool(state.get("in_plan")),
                    prepared=list(state.get("prepared", [])),
                    aborting=bool(state.get("aborting")),
                    step=state.get("step"),
                    decision=self.last_decision,
                    vote=self.pending_vote,
                )
                outcome = self.rejoin.attempt(rejoin, lost_m + self.controller_lost_s)
                if isinstance(outcome, Channel):
                    self.channel = outcome
                    self.heard_m = time.monotonic()
                    for msg in self.sticky:
                        outcome.try_send(msg)
                    break
            if outcome == "refused":
                return False
            time.sleep(pause)
            pause = min(1.0, 2 * pause)
        else:
            log.error("no controller took this agent back within %.0fs", self.controller_lost_s)
            return False
        log.warning("rejoined the restarted controller after %.2fs", time.monotonic() - lost_m)
        for fn in self.on_reconnect:
            fn()
        return True

    def _beat(self) -> None:
        """A heartbeat whenever nothing else was sent for ``heartbeat_s``: the controller counts any
        line as a sign of life, so a rank voting faster than that sends none (at 4,096 ranks that
        is ~20,000 lines a second the controller no longer reads; docs/benchmarks.md section 7)."""
        if self.heartbeat_s <= 0:
            return
        while not self.lost.is_set():
            idle = time.monotonic() - self.sent_m
            if idle >= self.heartbeat_s:
                self.send(HEARTBEAT)
                idle = 0.0
            time.sleep(self.heartbeat_s - idle)

    def _watch(self) -> None:
        while True:
            if self.lost.wait(timeout=0.5):
                if self.on_lost is None:
                    time.sleep(LOST_GRACE_S)  # the training thread normally exits through get() first
                self._exit("the controller's connection closed")
            silent = time.monotonic() - self.heard_m
            if self.controller_lost_s and silent > self.controller_lost_s:
                self._exit(
                    f"heard nothing from the controller for {silent:.1f}s "
                    f"(runtime.controller_lost_s={self.controller_lost_s:g})"
                )

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


@dataclass(frozen=True)
class Rejoiner:
    """One reconnect attempt to a restarted controller, with the identity of the first hello."""

    run_dir: Path
    hello: Hello
    """The first hello without its token (read again: it never changes) and without ``rejoin``."""

    def relayed(self, addr: dict[str, Any]) -> bool:
        return via_relay(addr, self.hello.kind)

    def attempt(self, rejoin: Rejoin, deadline_m: float) -> Channel | str:
        """The new channel once welcomed; ``"refused"`` (give up) or ``"retry"``.

        A refused connection means nobody listens any more: the supervisor, which holds the listening
        socket across controller restarts, is gone too, so no controller will come back."""
        try:
            addr = controller_address(self.run_dir, timeout_s=0.5)
            if self.relayed(addr):  # the relay connects to the controller when we arrive
                sock = connect_local(self.run_dir, self.hello.node, 0.5)
            else:
                sock = socket.create_connection((addr["host"], addr["port"]), timeout=0.5)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except ConnectionRefusedError:
            log.error("nothing listens at the controller's address any more: the supervisor is gone")
            return "refused"
        except (OSError, TmslurmError, KeyError, TypeError):
            return "retry"
        ch = Channel(sock)
        try:
            ch.sock.settimeout(max(0.1, deadline_m - time.monotonic()))
            ch.send(with_token(self.hello, read_token(self.run_dir), rejoin))
            reply = ch.recv()
            ch.sock.settimeout(None)
        except (OSError, ProtocolError, TmslurmError) as exc:
            log.info("rejoin attempt failed: %s", exc)
            ch.close()
            return "retry"
        if reply is None:  # the controller went away again, or the supervisor is between incarnations
            ch.close()
            return "retry"
        if reply.get("type") != "welcome":
            log.error("the restarted controller refused this agent: %s", str(reply)[:300])
            ch.close()
            return "refused"
        return ch


def via_relay(addr: dict[str, Any], kind: str) -> bool:
    """A worker or standby of a run with ``runtime.relay`` talks through its node's relay; a monitor,
    which runs the relay, never does."""
    return bool(addr.get("relay")) and kind != "monitor"


def hello(
    run_dir: Path, kind: AgentKind, ident: int, node: str, on_lost: Callable[[str], object] | None = None
) -> tuple[Link, Welcome]:
    addr = controller_address(run_dir)
    if via_relay(addr, kind):
        ch = Channel(connect_local(Path(run_dir), node, timeout_s=30.0))
    else:
        ch = connect(addr["host"], addr["port"], timeout_s=30.0)
    first = Hello(token="", kind=kind, id=ident, pid=os.getpid(), node=node, host=socket.gethostname())
    ch.send(with_token(first, read_token(run_dir)))
    reply = ch.recv()
    if reply is None or reply.get("type") != "welcome":
        raise TmslurmError(f"controller refused {kind} {ident}: {reply}")
    welcome = decode_controller(reply)
    cfg = welcome.config
    det = cfg["detect"]
    beat_s = float(det["monitor_interval_s"] if kind == "monitor" else det["heartbeat_interval_s"])
    rejoiner = Rejoiner(Path(run_dir), first) if restartable(cfg) else None
    link = Link(
        ch,
        beat_s if cfg["bench"]["heartbeats"] else 0.0,
        float(cfg["runtime"]["controller_lost_s"]),
        on_lost=on_lost,
        rejoin=rejoiner,
    )
    link.start()
    return link, welcome


def with_token(first: Hello, token: str, rejoin: Rejoin | None = None) -> Hello:
    """``first`` (kept without the token) as it is sent: with the run token, and the rejoin if any. The
    token is not validated here: the controller judges it, as it judges any first line."""
    return first.model_copy(update={"token": token, "rejoin": rejoin})


def restartable(cfg: dict[str, Any]) -> bool:
    """A supervisor restarts this run's controller (runtime.controller_restarts > 0)."""
    return int(cfg["runtime"].get("controller_restarts", 0)) > 0


def node_name(arg: str | None) -> str:
    return arg or os.environ.get("TMSLURM_NODE") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
