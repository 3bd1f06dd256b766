"""``bench control``: the real controller under N simulated agents; commit latency, CPU, RSS, threads.

Contract: for each N in ``--sizes`` (default 64 256 1024 4096) it starts the real controller in its
own process (:mod:`benchmarks.ctlhost`: the real loop, gate and server, a spawner that starts
nothing) with ``parallel.dp=N/pp``, two standbys and ``detect.heartbeat_interval_s``, then drives
it from this process with N + 2 simulated agents (:mod:`benchmarks.loadgen`, one thread, real
protocol over loopback TCP, no torch) through:

1. admission (``admit_s``: first connect to the last ``welcome``, at most ``--window`` hellos open;
   no new ``welcome`` for ``--stall-s`` fails the size, ``admitted`` says how far it got);
2. ``--warmup`` steps, then ``--steps`` measured steps (fewer when ``--max-measure-s`` passes first:
   ``samples`` says how many): commit latency = the last vote of a step
   sent -> that step's decision received by every slot owner (p50/p99), the controller's CPU per
   step (whole process and its loop thread, /proc schedstat on-CPU time deltas), its RSS and threads,
   heartbeats per second, and this generator's own CPU;
3. optionally (``--profile N``) py-spy on the controller for ``--profile-s`` seconds (top frames);
4. a planned switch: an admin ``notice`` for the node of rank 1 (``switch_plan_ms``: notice sent ->
   the last ``prepare``/``join`` received; ``switch_commit_ms``: the last ``prepared`` sent -> the
   decision carrying the switch received by all; ``switch_done_ms``: notice -> the first decision
   with the joiner voting received by all);
5. a recovery: rank 2's connection closes (``recovery_abort_ms``: close -> the last ``abort``
   received; ``recovery_plan_ms``: the last ``aborted`` sent -> the last ``recover``/``join``
   received; ``recovery_ms``: close -> the redone step's decision received by all, which includes
   one step time);
6. a ``stop`` request: every agent gets the final decision and reports ``done``; the controller
   must exit with a summary.

Failure behaviour: a size that fails (the controller dies, a phase times out, the generator
breaks) gives a row with ``failed`` (why) and ``reached`` (the last phase completed) and the
benchmark goes on with the next size; the controller process is always stopped. Writes
``--json`` (docs/bench/control_scale.json) with every row, the command, date and git commit, and
prints one line per phase and a side-by-side table.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, commit, recorded_command, say, write_json
from benchmarks.ctlhost import raise_open_files
from benchmarks.loadgen import LoadGen
from benchmarks.procstat import proc_sample, self_cpu_s, summarize, top_frames
from benchmarks.simagent import SimAgent
from tmslurm.core.errors import TmslurmError
from tmslurm.core.topology import Layout
from tmslurm.wire.messages import NoticeRequest, StopRequest
from tmslurm.wire.protocol import exchange, read_token

log = logging.getLogger(__name__)
STANDBYS = 2
SWITCH_RANK = 1
KILL_RANK = 2


class Failed(TmslurmError):
    """A size could not be measured to the end."""


class Run:
    """One size: the controller process, the generator on its own thread, and the figures so far."""

    def __init__(self, n: int, args: Any, out: Path) -> None:
        self.n, self.args = n, args
        self.run_dir = out / f"n{n}"
        self.row: dict[str, Any] = {"ranks": n, "reached": "start"}
        self.killed_step: int | None = None
        """The step the recovery's victim was at when its connection closed (its decision may be lost)."""
        overrides = [
            f"parallel.dp={n // args.pp}",
            f"parallel.pp={args.pp}",
            f"parallel.ranks_per_node={max(1, args.relay)}",
            f"standby.count={STANDBYS}",
            "train.steps=100000000",
            "model=tiny",
            f"detect.heartbeat_interval_s={args.heartbeat_s}",
            *args.override,
        ]
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / f"n{n}.controller.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.ctlhost", "--run-dir", str(self.run_dir), *overrides],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )  # benchmarks/ is not installed
        self.gen: LoadGen | None = None
        self.thread: threading.Thread | None = None

    # ---- phases -------------------------------------------------------------------------------
    def start(self) -> None:
        addr = self._wait(lambda: _read_json(self.run_dir / "controller.json"), 120, "controller.json")
        self.addr = addr
        cfg = json.loads((self.run_dir / "config.json").read_text())
        layout = Layout(
            cfg["parallel"]["dp"], cfg["parallel"]["pp"], cfg["parallel"]["tp"], n_layer=cfg["model"]["n_layer"]
        )
        token = read_token(self.run_dir)
        per_node = max(1, self.args.relay)
        agents = [SimAgent("worker", r, f"sim{r // per_node}", layout, token) for r in range(layout.world)]
        agents += [SimAgent("standby", i, f"spare{i // per_node}", layout, token) for i in range(STANDBYS * per_node)]
        self.gen = LoadGen(
            addr["host"],
            addr["port"],
            agents,
            layout.world,
            self.args.step_ms / 1000.0,
            self.args.heartbeat_s,
            self.args.window,
            relay=self.args.relay > 0,
        )
        self.thread = threading.Thread(target=self.gen.run, name="loadgen", daemon=True)
        self.thread.start()

    def admit(self) -> None:
        gen = self._gen()
        seen = [0, time.monotonic()]

        def admitted() -> float | None:
            self.row["admitted"] = gen.admitted
            self.row["generator_late_max_admit_ms"] = _r(1000.0 * gen.late_max_s)
            if gen.admitted > seen[0]:
                seen[:] = [gen.admitted, time.monotonic()]
            elif time.monotonic() - seen[1] > self.args.stall_s:
                raise Failed(
                    f"admission stalled at {gen.admitted}/{gen.total} agents for {self.args.stall_s:.0f}s "
                    f"({gen.fenced} fenced)"
                )
            return gen.t_admitted

        t_admitted: float = self._wait(admitted, max(60.0, self.n * 0.1), f"{gen.total} agents admitted")
        if gen.t_first_connect is None:
            raise Failed(f"{gen.total} agents admitted but the load generator recorded no first connect")
        self.row.update(
            admit_s=round(t_admitted - gen.t_first_connect, 3),
            hello_retries=gen.retries,
            generator_late_max_admit_ms=_r(1000.0 * gen.late_max_s),
        )
        self.row["reached"] = "admitted"
        say(f"N={self.n}: {gen.total} agents admitted in {self.row['admit_s']:.2f}s")

    def measure(self) -> None:
        gen, a = self._gen(), self.args
        self._until_step(a.warmup - 1)
        s0, aborts0 = gen.last_complete, len(gen.abort_step)
        gen.late_max_s = 0.0
        p0, g0, hb0, t0 = proc_sample(self.proc.pid), self_cpu_s(), gen.hb_sent, time.monotonic()
        samples = [p0]
        end = t0 + a.max_measure_s

        def poll() -> bool | None:
            samples.append(proc_sample(self.proc.pid, cpu=False))
            return (
                True
                if gen.last_complete >= s0 + a.steps or (time.monotonic() > end and gen.last_complete > s0)
                else None
            )

        self._wait(poll, a.max_measure_s + 120.0, f"{a.steps} steps after step {s0}")
        p1, g1, hb1, t1 = proc_sample(self.proc.pid), self_cpu_s(), gen.hb_sent, time.monotonic()
        s1 = gen.last_complete
        lat = gen.query(
            lambda: [
                1000.0 * (gen.rec.recv[("decision", s)].last - gen.rec.sent[("vote", s)].last)
                for s in range(s0 + 1, s1 + 1)
            ]
        )
        steps, wall = s1 - s0, t1 - t0
        stats = summarize(lat)
        self.row.update(
            samples=stats["samples"],
            commit_p50_ms=_r(stats["p50"]),
            commit_p99_ms=_r(stats["p99"]),
            commit_max_ms=_r(stats["max"]),
            step_ms=a.step_ms,
            steps_per_s=round(steps / wall, 2),
            controller_cpu_ms_per_step=_r(1000.0 * (p1.cpu_s - p0.cpu_s) / steps),
            controller_loop_cpu_ms_per_step=_r(1000.0 * (p1.main_cpu_s - p0.main_cpu_s) / steps),
            controller_cpu_cores=_r((p1.cpu_s - p0.cpu_s) / wall),
            threads=max(s.threads for s in samples),
            rss_mb=round(max(s.rss_mb for s in samples), 1),
            heartbeats_per_s=round((hb1 - hb0) / wall, 1),
            generator_cpu_cores=_r((g1 - g0) / wall),
            generator_late_max_ms=_r(1000.0 * gen.late_max_s),
            aborts_during_measure=len(gen.abort_step) - aborts0,
            fenced_during_measure=gen.fenced,
        )
        self.row["reached"] = "measured"
        say(
            f"N={self.n}: {steps} steps, commit p50 {self.row['commit_p50_ms']} ms p99 {self.row['commit_p99_ms']} ms, "
            f"controller {self.row['controller_cpu_ms_per_step']} ms CPU/step, {self.row['threads']} threads, "
            f"{self.row['rss_mb']} MB, generator {self.row['generator_cpu_cores']} cores"
        )

    def profile(self) -> None:
        spy = shutil.which("py-spy")
        if spy is None:
            self.row["profile"] = {"error": "py-spy is not installed"}
            return
        raw = self.run_dir.parent / f"n{self.n}.pyspy.txt"
        say(f"N={self.n}: py-spy on the controller for {self.args.profile_s:.0f}s")
        cmd = [
            spy,
            "record",
            "--pid",
            str(self.proc.pid),
            "--duration",
            str(int(self.args.profile_s)),
            "--rate",
            "50",
            "--gil",
            "--format",
            "raw",
            "--output",
            str(raw),
            "--nonblocking",
        ]  # --gil: the thread running Python
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.profile_s + 60)
            error = r.stderr.strip()[-300:]
        except subprocess.TimeoutExpired:
            error = "py-spy did not finish in time"
        self.row["profile"] = top_frames(raw) if raw.exists() else {"error": error}

    def switch(self) -> None:
        gen = self._gen()
        t0 = time.monotonic()
        reply = exchange(
            self.addr,
            NoticeRequest(
                type="notice",
                token=read_token(self.run_dir),
                event="maintenance",
                node=f"sim{SWITCH_RANK}",
                reason="bench control",
            ),
            30.0,
        )
        if reply.get("type") != "ok":
            raise Failed(f"notice refused: {reply}")
        epoch = self._wait(lambda: next(iter(gen.switch_step), None), 120, "the switch to be applied")
        step = gen.switch_step[epoch]
        self._until_step(step + 1)
        recv, sent = gen.query(lambda: (dict(gen.rec.recv), dict(gen.rec.sent)))
        plan_last = max(recv[(k, epoch)].last for k in ("prepare", "join") if (k, epoch) in recv)
        self.row.update(
            switch_plan_ms=_r(1000.0 * (plan_last - t0)),
            switch_commit_ms=_r(1000.0 * (recv[("decision", step)].last - sent[("prepared", epoch)].last)),
            switch_done_ms=_r(1000.0 * (recv[("decision", step + 1)].last - t0)),
            switch_prepares=recv[("prepare", epoch)].count if ("prepare", epoch) in recv else 0,
        )
        self.row["reached"] = "switched"
        say(
            f"N={self.n}: switch plan {self.row['switch_plan_ms']} ms, commit after last prepared "
            f"{self.row['switch_commit_ms']} ms, done {self.row['switch_done_ms']} ms"
        )

    def recover(self) -> None:
        gen = self._gen()
        before = set(gen.abort_step)
        t0, self.killed_step = gen.kill(KILL_RANK)
        epoch = self._wait(lambda: min(set(gen.abort_step) - before, default=None), 60, "the abort")
        redo = gen.abort_step[epoch]
        self._until_step(redo)
        recv, sent = gen.query(lambda: (dict(gen.rec.recv), dict(gen.rec.sent)))
        plan_last = max(recv[(k, epoch)].last for k in ("recover", "join") if (k, epoch) in recv)
        self.row.update(
            recovery_abort_ms=_r(1000.0 * (recv[("abort", epoch)].last - t0)),
            recovery_plan_ms=_r(1000.0 * (plan_last - sent[("aborted", epoch)].last)),
            recovery_ms=_r(1000.0 * (recv[("decision", redo)].last - t0)),
        )
        self.row["reached"] = "recovered"
        say(
            f"N={self.n}: recovery: abort to all {self.row['recovery_abort_ms']} ms, plan after last aborted "
            f"{self.row['recovery_plan_ms']} ms, redone step committed {self.row['recovery_ms']} ms after the close"
        )

    def stop(self) -> None:
        gen = self._gen()
        self._until_step(gen.last_complete + 2)
        exchange(self.addr, StopRequest(type="stop", token=read_token(self.run_dir)), 30.0)
        try:
            rc = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            raise Failed("the controller did not exit after stop") from None
        summary = _read_json(self.run_dir / "summary.json") or {}
        final = gen.last_complete
        # the victim's socket may hold the decision of the step it was at when it closed: not expected
        expected = {s: self.n - (s == self.killed_step) for s in range(final + 1)}
        missing = gen.query(
            lambda: sum(
                max(0, expected[s] - gen.rec.recv[("decision", s)].count)
                for s in range(final + 1)
                if ("decision", s) in gen.rec.recv
            )
        )
        self.row.update(
            controller_rc=rc,
            final_hash=bool(summary.get("final_params_sha256")),
            steps_committed=final + 1,
            decisions_missing=missing,
            agents_fenced=gen.fenced,
            bad_lines=gen.bad_lines,
            every_decision_received=missing == 0 and all(("decision", s) in gen.rec.recv for s in range(final + 1)),
        )
        self.row["reached"] = "stopped"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if self.gen is not None:
            self.gen.stop()
        if self.thread is not None:
            self.thread.join(30)
        self.log.close()

    # ---- helpers ------------------------------------------------------------------------------
    def _gen(self) -> LoadGen:
        assert self.gen is not None
        return self.gen

    def _wait(self, probe: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(f"the controller exited (rc {self.proc.returncode}) waiting for {what}")
            if self.gen is not None and self.gen.error is not None:
                raise Failed(f"the load generator failed: {self.gen.error}")
            if self.gen is not None and self.gen.fenced > self.n // 2:
                raise Failed(f"the controller closed {self.gen.fenced} agents (a restart fallback: nobody to restart)")
            got = probe()
            if got is not None:
                return got
            time.sleep(0.05)
        raise Failed(f"timed out after {timeout:.0f}s waiting for {what}")

    def _until_step(self, step: int, on_poll: Callable[[], None] | None = None) -> None:
        gen = self._gen()

        def probe() -> bool | None:
            if on_poll is not None:
                on_poll()
            return True if gen.last_complete >= step else None

        self._wait(probe, 60.0 + (step - max(gen.last_complete, 0)) * 2.0, f"step {step} (at {gen.last_complete})")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def one_size(n: int, args: Any, out: Path) -> dict[str, Any]:
    run = Run(n, args, out)
    try:
        run.start()
        run.admit()
        run.measure()
        if args.profile == n:
            run.profile()
        run.switch()
        run.recover()
        run.stop()
    except Exception as exc:  # any failure ends this size only: report it and go on with the next
        log.exception("N=%d failed", n)
        run.row["failed"] = f"{type(exc).__name__}: {exc}"[:500]
        say(f"N={n}: FAILED after '{run.row['reached']}': {exc}")
    finally:
        run.close()
    return run.row


COLUMNS = [
    ("ranks", "ranks"),
    ("admit_s", "admit s"),
    ("commit_p50_ms", "p50 ms"),
    ("commit_p99_ms", "p99 ms"),
    ("controller_cpu_ms_per_step", "ctl CPU ms/step"),
    ("controller_loop_cpu_ms_per_step", "loop ms/step"),
    ("controller_cpu_cores", "ctl cores"),
    ("threads", "threads"),
    ("rss_mb", "RSS MB"),
    ("heartbeats_per_s", "hb/s"),
    ("generator_cpu_cores", "gen cores"),
    ("switch_plan_ms", "switch plan ms"),
    ("switch_commit_ms", "switch commit ms"),
    ("recovery_ms", "recovery ms"),
]


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table, one row per N (``-`` where a figure is missing)."""
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    lines = [head, "|" + "---:|" * len(COLUMNS)]
    for row in rows:
        cells = ["-" if row.get(k) is None else str(row[k]) for k, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        if row.get("failed"):
            lines.append(f"\nN={row['ranks']}: failed after '{row['reached']}': {row['failed']}")
    return "\n".join(lines)


def main(args: Any) -> dict[str, Any]:
    nofile = raise_open_files()
    out = Path(args.out).resolve()
    rows = []
    for n in args.sizes:
        say(f"N={n}: starting the controller ({n} ranks, pp={args.pp}, {STANDBYS} standbys, open files limit {nofile})")
        rows.append(one_size(n, args, out))
    print(table(rows))
    command, measured = recorded_command("control"), commit()
    for row in rows:
        row.update(
            label=args.label,
            ranks_per_relay=args.relay,
            overrides=args.override,
            command=command,
            git_commit=measured,
            date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        )
    path = Path(args.json)
    if args.append and path.exists():
        rows = json.loads(path.read_text())["rows"] + rows
    result = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": measured,
        "setup": {
            "pp": args.pp,
            "standbys": STANDBYS,
            "step_ms": args.step_ms,
            "heartbeat_s": args.heartbeat_s,
            "warmup": args.warmup,
            "steps": args.steps,
            "window": args.window,
            "overrides": args.override,
        },
        "rows": rows,
    }
    write_json(path, result)
    return result
