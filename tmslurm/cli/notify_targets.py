"""Which run directories ``tmslurm notify`` sends to, and whether it may: each one vetted on its own.

Contract: :func:`survey` lists the directories under a runs root, in name order, without following
a symlink (one that points at another directory of the root is an alias: skipped, not a run of
its own). :func:`vet` looks at one run directory and returns a :class:`Target` (the controller's
host and port from ``controller.json``, and the run token when it is to be read) or a
:class:`Skip` saying why nothing may be sent there. It never raises for an odd directory, and it
opens every file with ``O_NOFOLLOW`` and checks the open file itself, so a file swapped after a
check cannot slip through. A run is skipped when its directory is missing or cannot be read;
when it has finished (``summary.json``) or has no ``controller.json`` (not running, or an empty
directory); when it is not trusted (the directory, ``controller.json`` or the token is a symlink
or not a plain file, a file is not owned by the directory's owner, or the directory or
``controller.json`` is writable by group or others); when ``controller.json`` is not a JSON object
with a ``host`` and a ``port`` in 1..65535; when the token is empty or over
:data:`MAX_TOKEN_CHARS` characters. :attr:`Skip.live` says whether the skipped directory counts as
a live run that did not get the notice: a finished run, a directory without ``controller.json``
found under a runs root, and an alias do not; everything else does (and every directory the
caller named with ``--run-dir``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from tmslurm.core.errors import NoticeError
from tmslurm.core.rundir import RunDir

MAX_TOKEN_CHARS = 256
"""A longer token file is not a tmslurm token (those are 32 hex characters): nothing is sent."""
MAX_FILE_BYTES = 64 * 1024
"""How much of ``controller.json`` or the token is read at most."""
FINISHED = "the run has finished (it has a summary.json)"
"""The reason a finished run is skipped."""
_WRITABLE = stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True, kw_only=True)
class Target:
    """A run the notice may be sent to."""

    run_dir: Path
    """The run directory, as given or found."""
    host: str
    """The controller's host, from ``controller.json``."""
    port: int
    """The controller's port, from ``controller.json``."""
    token: str | None
    """The run's token (``RUN_DIR/token``) when it was to be read, else None."""


@dataclass(frozen=True, kw_only=True)
class Skip:
    """A run directory nothing is sent to."""

    run_dir: Path
    """The run directory, as given or found."""
    why: str
    """Why, as printed after ``skipped, ``."""
    live: bool
    """Whether it counts as a live run that did not get the notice (the exit status says so)."""


class _Unfit(Exception):
    def __init__(self, why: str, *, live: bool = True) -> None:
        super().__init__(why)
        self.why, self.live = why, live


def survey(root: Path) -> tuple[list[Path], list[Skip]]:
    """The directories under ``root`` to vet, in name order (a symlink among them too: :func:`vet`
    refuses it), and the symlinks that are aliases of one of them. None when ``root`` is missing;
    :class:`NoticeError` when it cannot be listed."""
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        raise NoticeError(f"cannot list the runs root {root}: {exc.strerror}") from None
    dirs = [p for p in entries if _is_dir(p, follow=False)]
    real = {os.path.realpath(p) for p in dirs}
    runs, aliases = list(dirs), []
    for p in entries:
        if p.is_symlink() and _is_dir(p, follow=True):
            if os.path.realpath(p) in real:
                target = Path(os.path.realpath(p)).name
                aliases.append(Skip(run_dir=p, why=f"a symlink to {target}, which is visited itself", live=False))
            else:
                runs.append(p)
    return sorted(runs), aliases


def _is_dir(path: Path, *, follow: bool) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path, follow_symlinks=follow).st_mode)
    except OSError:
        return not follow  # listed but not inspectable: vet says why


def vet(run_dir: Path, *, read_token: bool, named: bool) -> Target | Skip:
    """``run_dir`` as a :class:`Target`, or a :class:`Skip` naming why not. ``named``: the caller
    named it (``--run-dir``), so even a finished one counts as live."""
    try:
        return _vet(run_dir, read_token=read_token, named=named)
    except _Unfit as exc:
        return Skip(run_dir=run_dir, why=exc.why, live=exc.live)


def _vet(run_dir: Path, *, read_token: bool, named: bool) -> Target:
    rd = RunDir(run_dir)
    dfd = _open_dir(run_dir)
    try:
        d = os.fstat(dfd)
        names = _listing(dfd)
        if "summary.json" in names:
            raise _Unfit(FINISHED, live=named)
        if "controller.json" not in names:
            if not names:
                raise _Unfit("an empty directory (not a tmslurm run)", live=named)
            raise _Unfit(
                f"{rd.controller} does not exist (the run's controller is not running, or the run ended)", live=named
            )
        if d.st_mode & _WRITABLE:
            raise _Unfit("not trusted (the run directory is writable by group or others)")
        not_running = f"{rd.controller} does not exist (the run's controller is not running, or the run ended)"
        host, port = _address(_read(dfd, "controller.json", d, writable_too=True, missing=not_running))
        no_token = f"{rd.token} does not exist (pass --token, or sign with --private-key-file)"
        token = _token(_read(dfd, "token", d, writable_too=False, missing=no_token)) if read_token else None
    finally:
        os.close(dfd)
    return Target(run_dir=run_dir, host=host, port=port, token=token)


def _open_dir(run_dir: Path) -> int:
    try:
        return os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise _Unfit(f"{run_dir} does not exist (no such run directory)") from None
    except OSError as exc:
        if os.path.islink(run_dir):
            raise _Unfit("not trusted (the run directory is a symlink: pass the directory it points to)") from None
        if exc.errno == errno.ENOTDIR:
            raise _Unfit(f"{run_dir} is not a directory") from None
        raise _Unfit(f"cannot read the run directory ({exc.strerror})") from None


def _listing(dfd: int) -> set[str]:
    try:
        return set(os.listdir(dfd))
    except OSError as exc:
        raise _Unfit(f"cannot read the run directory ({exc.strerror})") from None


def _read(dfd: int, name: str, d: os.stat_result, *, writable_too: bool, missing: str) -> bytes:
    """At most :data:`MAX_FILE_BYTES` + 1 bytes of the plain file ``name`` in the directory ``dfd``,
    owned by the directory's owner (and, with ``writable_too``, not writable by group or others);
    ``missing`` is the reason when there is no such file."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        raise _Unfit(missing) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Unfit(f"not trusted ({name} is a symlink)") from None
        raise _Unfit(f"cannot read {name} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Unfit(f"not trusted ({name} is not a plain file)")
        if st.st_uid != d.st_uid:
            raise _Unfit(f"not trusted ({name} is owned by uid {st.st_uid}, the run directory by uid {d.st_uid})")
        if writable_too and st.st_mode & _WRITABLE:
            raise _Unfit(f"not trusted ({name} is writable by group or others)")
        return os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _Unfit(f"cannot read {name} ({exc.strerror})") from None
    finally:
        os.close(fd)


def _address(data: bytes) -> tuple[str, int]:
    """The controller's (host, port) from ``controller.json``'s bytes."""
    if len(data) > MAX_FILE_BYTES:
        raise _Unfit(f"controller.json is over {MAX_FILE_BYTES} bytes (not a tmslurm controller.json)")
    try:
        addr = json.loads(data)
    except (ValueError, RecursionError):
        raise _Unfit("controller.json is not JSON") from None
    if not isinstance(addr, dict):
        raise _Unfit("controller.json is not a JSON object")
    host, port = addr.get("host"), addr.get("port")
    if not isinstance(host, str) or not host:
        raise _Unfit("controller.json has no host")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise _Unfit(f"controller.json has a bad port {port!r} (valid: 1..65535)")
    return host, port


def _token(data: bytes) -> str:
    try:
        token = data.decode().strip()
    except UnicodeDecodeError:
        raise _Unfit("the token is not text (not a tmslurm token)") from None
    if len(data) > MAX_FILE_BYTES or len(token) > MAX_TOKEN_CHARS:
        raise _Unfit(f"the token is over {MAX_TOKEN_CHARS} characters (not a tmslurm token)")
    if not token:
        raise _Unfit("the token file is empty")
    return token
