"""``tmslurm``: user and admin commands (status, stop, notify, report)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from tmslurm.cli.commands import main as run

    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
