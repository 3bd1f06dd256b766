"""The exception hierarchy of tmslurm, in one place.

Contract: every error tmslurm raises on purpose derives from :class:`TmslurmError`. Messages say
what was wrong, list the valid values where there are some, and name the fix (for configuration
errors: the Hydra override to change). Catching ``TmslurmError`` at a command-line entry point and
printing its message is always enough for a user to act.
"""

from __future__ import annotations


class TmslurmError(Exception):
    """Base of every error tmslurm raises deliberately."""


class ConfigError(TmslurmError):
    """An invalid configuration or command-line override; the message names the override."""


class SlurmError(TmslurmError):
    """A Slurm command failed, timed out, or the controller could not be reached."""


class SlurmParseError(SlurmError):
    """Slurm printed something we could not parse; the message quotes the offending line."""


class CommError(TmslurmError):
    """A collective or point-to-point operation failed: dead peer, broken connection, timeout, abort."""


class CommAborted(CommError):
    """A pending operation was abandoned because the run decided to abort (e.g. a hung peer)."""


class CheckpointError(TmslurmError):
    """A checkpoint is missing, unreadable or corrupt; the message names the file."""


class AuthError(TmslurmError):
    """A control request carried no token or a wrong one."""


class ProtocolError(TmslurmError):
    """A malformed control or agent message; the run is not disturbed."""


class NoticeError(TmslurmError):
    """A notice names an unknown node or rank, or carries a bad deadline or event kind."""
