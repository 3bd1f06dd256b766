"""Reading one JSON object from a file, with an error that names the file; writing one whole.

Contract: :func:`write_json_atomic` writes ``path`` through a temporary file and ``os.replace``, so
a reader that polls for the file sees all of it or none (an ``OSError`` is the caller's).
:func:`read_json_object` returns the object in ``path``. A missing file, one that cannot
be read or parsed, or JSON that is not an object raises ``error`` (a
:class:`~tmslurm.core.errors.TmslurmError` type, the caller's own if it has one) naming the file and
``what`` it should have held; nothing else is raised for bad input.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tmslurm.core.errors import TmslurmError


def read_json_object(path: Path, what: str, error: type[TmslurmError] = TmslurmError) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: missing ({what})") from None
    except (OSError, ValueError) as exc:
        raise error(f"{path}: unreadable {what}: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: {what} is not a JSON object, but {type(data).__name__}")
    return data


def write_json_atomic(path: Path, data: Any, indent: int | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str))
    os.replace(tmp, path)
