"""``tmslurm notify --runs-root R`` never stops at an odd run directory.

Real directories under a real runs root, real sockets on 127.0.0.1: a run ``b`` that is odd in one
way sits between two good runs ``a`` and ``c`` (each a fake controller that accepts the notice).
The odd one is skipped with its reason, ``a`` and ``c`` still get the notice, and the result says
whether every live run got it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tmslurm.cli.notify import CONNECT_TIMEOUT_S, Delivery, Undelivered, notify
from tmslurm.cli.notify_targets import MAX_TOKEN_CHARS, Skip, Target, vet
from tmslurm.core.errors import AuthError, NoticeError

CLI = "import sys; from tmslurm.cli.main import main; sys.exit(main())"  # what the `tmslurm` console script runs
NOBODY = 65534
OK = {"type": "ok", "ok": True, "accepted": {}}


class Controller:
    """A fake run controller on 127.0.0.1: answers the first line of each connection with ``reply``."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.received.append(json.loads(conn.makefile("rb").readline()))
                conn.sendall((json.dumps(self.reply) + "\n").encode())

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.sock.close()
        self.thread.join(timeout=10)


@pytest.fixture
def controller() -> Iterator[Controller]:
    c = Controller(OK)
    yield c
    c.close()


def make_run(run: Path, port: int, *, token: str = "t", mode: int = 0o700) -> Path:
    run.mkdir(mode=mode)
    os.chmod(run, mode)
    (run / "controller.json").write_text(json.dumps({"host": "127.0.0.1", "port": port}))
    os.chmod(run / "controller.json", 0o644)
    (run / "token").write_text(token)
    os.chmod(run / "token", 0o600)
    return run


def args(root: Path, **kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = dict(
        node="n1",
        rank=None,
        event="maintenance",
        deadline=None,
        reason="",
        run_dir=None,
        runs_root=str(root),
        token=None,
        private_key_file=None,
        timeout=5.0,
    )
    return argparse.Namespace(**{**base, **kw})


def around(root: Path, port: int) -> None:
    """The two good runs ``a`` and ``c`` around the odd one."""
    make_run(root / "a", port)
    make_run(root / "c", port)


def line_of(out: Delivery, run: Path) -> str:
    (line,) = [ln for ln in out.lines if ln.startswith(f"{run}: ")]
    return line


def controller_json(text: str) -> Callable[[Path, int], None]:
    def make(run: Path, port: int) -> None:
        make_run(run, port)
        (run / "controller.json").write_text(text)

    return make


def with_token(token: str) -> Callable[[Path, int], None]:
    def make(run: Path, port: int) -> None:
        make_run(run, port, token=token)

    return make


def outside_run(run: Path, port: int) -> None:
    real = make_run(run.parent.parent / "elsewhere", port)
    run.symlink_to(real)


def alias(run: Path, port: int) -> None:
    run.symlink_to(run.parent / "a")


def linked_controller_json(run: Path, port: int) -> None:
    make_run(run, port)
    (run.parent.parent / "real.json").write_text(json.dumps({"host": "127.0.0.1", "port": port}))
    (run / "controller.json").unlink()
    (run / "controller.json").symlink_to(run.parent.parent / "real.json")


def fifo_controller_json(run: Path, port: int) -> None:
    make_run(run, port)
    (run / "controller.json").unlink()
    os.mkfifo(run / "controller.json", 0o644)


def foreign_controller_json(run: Path, port: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    make_run(run, port)
    os.chown(run / "controller.json", NOBODY, NOBODY)


def chmod(name: str, mode: int) -> Callable[[Path, int], None]:
    def make(run: Path, port: int) -> None:
        make_run(run, port)
        os.chmod(run / name if name else run, mode)

    return make


def finished(run: Path, port: int) -> None:
    make_run(run, port)
    (run / "summary.json").write_text("{}")


def not_started(run: Path, port: int) -> None:
    run.mkdir()
    (run / "config.json").write_text("{}")


LIVE_ODDITIES = {
    "no-host": (controller_json('{"port": 5}'), "skipped, controller.json has no host"),
    "port-zero": (controller_json('{"host": "127.0.0.1", "port": 0}'), "bad port 0 (valid: 1..65535)"),
    "port-too-big": (controller_json('{"host": "127.0.0.1", "port": 70000}'), "bad port 70000"),
    "port-a-string": (controller_json('{"host": "127.0.0.1", "port": "80"}'), "bad port '80'"),
    "port-a-bool": (controller_json('{"host": "127.0.0.1", "port": true}'), "bad port True"),
    "not-json": (controller_json('{"host": '), "controller.json is not JSON"),
    "not-an-object": (controller_json("[1, 2]"), "controller.json is not a JSON object"),
    "token-too-long": (with_token("x" * (MAX_TOKEN_CHARS + 1)), "token is over 256 characters"),
    "token-empty": (with_token(""), "the token file is empty"),
    "symlinked-run-dir": (outside_run, "not trusted (the run directory is a symlink"),
    "symlinked-controller-json": (linked_controller_json, "not trusted (controller.json is a symlink)"),
    "fifo-controller-json": (fifo_controller_json, "not trusted (controller.json is not a plain file)"),
    "wrong-owner": (foreign_controller_json, f"not trusted (controller.json is owned by uid {NOBODY}"),
    "group-writable-dir": (chmod("", 0o770), "not trusted (the run directory is writable by group or others)"),
    "world-writable-controller-json": (chmod("controller.json", 0o646), "controller.json is writable by group"),
}


@pytest.mark.parametrize("make, reason", LIVE_ODDITIES.values(), ids=LIVE_ODDITIES.keys())
def test_an_odd_live_run_is_skipped_with_its_reason_and_the_others_get_the_notice(tmp_path, controller, make, reason):
    root = tmp_path / "runs"
    root.mkdir()
    around(root, controller.port)
    make(root / "b", controller.port)
    out = notify(args(root))
    assert out.accepted == [f"{root / r}: notice accepted (maintenance n1)" for r in ("a", "c")]
    assert reason in line_of(out, root / "b") and line_of(out, root / "b") in out.failed
    assert len(controller.received) == 2  # nothing went to b
    problem = out.problem()
    assert isinstance(problem, Undelivered) and problem.status == 1
    assert str(problem).startswith("1 live run did not get the notice") and f"{root / 'b'}: skipped" in str(problem)


IDLE = {
    "empty": (lambda run, port: run.mkdir(), "skipped, an empty directory"),
    "not-started": (not_started, "controller.json does not exist (the run's controller is not running"),
    "alias-of-a": (alias, "skipped, a symlink to a, which is visited itself"),
}


@pytest.mark.parametrize("make, reason", IDLE.values(), ids=IDLE.keys())
def test_a_directory_without_a_live_run_is_skipped_with_its_reason_and_counts_for_nothing(
    tmp_path, controller, make, reason
):
    root = tmp_path / "runs"
    root.mkdir()
    around(root, controller.port)
    make(root / "b", controller.port)
    (root / "notes.txt").write_text("not a directory: ignored")
    out = notify(args(root))
    assert len(out.accepted) == 2 and out.failed == []
    assert reason in line_of(out, root / "b") and len(out.lines) == 3
    assert out.problem() is None


def test_finished_runs_share_one_line(tmp_path, controller):
    root = tmp_path / "runs"
    root.mkdir()
    around(root, controller.port)
    finished(root / "b", controller.port)
    finished(root / "d", controller.port)
    out = notify(args(root))
    assert out.lines[-1] == f"{root}: 2 finished runs skipped" and len(out.lines) == 3
    assert out.problem() is None and len(controller.received) == 2


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Permissions as an unprivileged user see them (root reads every directory)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)


def test_an_unreadable_run_directory_is_skipped_and_the_others_get_the_notice(controller):
    base = Path(tempfile.mkdtemp())  # a root nobody may enter (pytest's tmp_path is root's alone)
    try:
        os.chmod(base, 0o755)
        root = base / "runs"
        root.mkdir(mode=0o755)
        for name in ("a", "c"):
            make_run(root / name, controller.port, mode=0o755)
        make_run(root / "b", controller.port, mode=0o700 if os.geteuid() == 0 else 0o000)
        with as_nobody():
            out = notify(args(root, token="t"))  # the token given: nobody reads no token file
        assert len(out.accepted) == 2
        assert line_of(out, root / "b") == f"{root / 'b'}: skipped, cannot read the run directory (Permission denied)"
        assert isinstance(out.problem(), Undelivered)
    finally:
        os.chmod(base / "runs" / "b", 0o700)
        shutil.rmtree(base)


def test_a_token_of_256_characters_is_sent(tmp_path):
    run = make_run(tmp_path / "run", 5, token="y" * MAX_TOKEN_CHARS + "\n")
    assert vet(run, read_token=True, named=True) == Target(
        run_dir=run, host="127.0.0.1", port=5, token="y" * MAX_TOKEN_CHARS
    )


def refused_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_nobody_listens_on_is_reported_at_once(tmp_path, controller):
    root = tmp_path / "runs"
    root.mkdir()
    around(root, controller.port)
    make_run(root / "b", refused_port())
    t0 = time.monotonic()
    out = notify(args(root))
    took = time.monotonic() - t0
    line = line_of(out, root / "b")
    assert line.startswith(f"{root / 'b'}: not reachable (controller at 127.0.0.1:") and "refused" in line
    assert len(out.accepted) == 2 and took < CONNECT_TIMEOUT_S  # one try, no 10 s of retries
    problem = out.problem()
    assert isinstance(problem, Undelivered) and problem.status == 1


def test_an_address_that_never_answers_costs_the_connect_timeout_once(tmp_path, controller):
    """A listener whose accept queue is full: Linux drops the SYN, so the connection never answers."""
    root = tmp_path / "runs"
    root.mkdir()
    around(root, controller.port)
    full = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = full.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)  # fills the queue of one
    try:
        make_run(root / "b", port)
        t0 = time.monotonic()
        out = notify(args(root))
        took = time.monotonic() - t0
    finally:
        filler.close()
        full.close()
    assert line_of(out, root / "b") == (
        f"{root / 'b'}: not reachable (controller at 127.0.0.1:{port} is unreachable: no answer within 2 s. "
        "Is the run still alive? (tmslurm status RUN_DIR))"
    )
    assert len(out.accepted) == 2
    assert CONNECT_TIMEOUT_S <= took < CONNECT_TIMEOUT_S + 2.0, took


def test_a_controller_that_connects_but_never_answers_costs_the_reply_timeout(tmp_path, controller):
    root = tmp_path / "runs"
    root.mkdir()
    around(root, controller.port)
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)  # connections queue, nobody reads
    try:
        port = silent.getsockname()[1]
        make_run(root / "b", port)
        out = notify(args(root, timeout=0.5))
    finally:
        silent.close()
    assert line_of(out, root / "b") == (
        f"{root / 'b'}: not reachable (the controller at 127.0.0.1:{port} took the connection but gave no answer "
        "within 0.5 s)"
    )
    assert len(out.accepted) == 2 and isinstance(out.problem(), Undelivered)


def test_a_run_that_does_not_use_the_node_needs_no_notice(tmp_path, controller):
    other = Controller({"type": "error", "error": "unknown node 'n1'; this run uses: x1"})
    try:
        root = tmp_path / "runs"
        root.mkdir()
        around(root, controller.port)
        make_run(root / "b", other.port)
        out = notify(args(root))
    finally:
        other.close()
    assert line_of(out, root / "b") == f"{root / 'b'}: unknown node 'n1'; this run uses: x1"
    assert out.problem() is None


def test_a_refused_token_is_an_auth_error_when_no_run_accepted(tmp_path):
    other = Controller({"type": "error", "error": "refused: missing or wrong token"})
    try:
        make_run(tmp_path / "b", other.port)
        out = notify(args(tmp_path))
    finally:
        other.close()
    problem = out.problem()
    assert isinstance(problem, AuthError) and "refused: missing or wrong token" in str(problem)


def test_only_directories_without_a_live_run_say_where_it_looked(tmp_path):
    (tmp_path / "empty").mkdir()
    out = notify(args(tmp_path))
    assert out.lines == [f"{tmp_path / 'empty'}: skipped, an empty directory (not a tmslurm run)"]
    problem = out.problem()
    assert isinstance(problem, NoticeError) and "no live tmslurm run found" in str(problem)


def cli(root: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", CLI, "notify", "--node", "n1", "--event", "maintenance", "--runs-root", str(root)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_the_exit_status_says_whether_every_live_run_got_the_notice(tmp_path, controller):
    root = tmp_path / "runs"
    root.mkdir()
    make_run(root / "a", controller.port)
    (root / "b").mkdir()
    p = cli(root)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        f"{root / 'a'}: notice accepted (maintenance n1)",
        f"{root / 'b'}: skipped, an empty directory (not a tmslurm run)",
    ]
    chmod("", 0o777)(root / "c", controller.port)
    p = cli(root)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"{root / 'c'}: skipped, not trusted" in p.stdout.splitlines()[-1]
    assert p.stderr.startswith("error: 1 live run did not get the notice")


def test_no_run_accepted_prints_the_idle_lines_and_one_error(tmp_path):
    (tmp_path / "e").mkdir()
    chmod("", 0o777)(tmp_path / "h", refused_port())
    p = cli(tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout.splitlines() == [f"{tmp_path / 'e'}: skipped, an empty directory (not a tmslurm run)"]
    assert p.stderr.splitlines() == [
        f"error: no run accepted the notice: {tmp_path / 'h'}: skipped, not trusted "
        "(the run directory is writable by group or others)"
    ]


def test_a_skip_counts_as_live_only_when_the_caller_named_the_directory(tmp_path):
    (tmp_path / "e").mkdir()
    found = vet(tmp_path / "e", read_token=False, named=False)
    named = vet(tmp_path / "e", read_token=False, named=True)
    assert isinstance(found, Skip) and not found.live
    assert isinstance(named, Skip) and named.live
