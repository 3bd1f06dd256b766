"""Site defaults: what a cluster's admin sets once for every run, resolved when a config is composed.

Contract: :func:`apply_site_defaults` fills ``security.admin_public_key_file`` (the public key signed
admin notices are checked with) when the run left it unset (None): with the file that
``$TMSLURM_ADMIN_PUBLIC_KEY_FILE`` names when that variable is set (set but empty: no site key), else
with :data:`SITE_ADMIN_PUBLIC_KEY` when that file exists. The path is made absolute, so the run's
``config.json`` records the file its controller reads. A run that sets the field keeps its value
(``''``: no key, every signed notice refused). Failure behaviour: a
:class:`~tmslurm.core.errors.ConfigError` naming the variable when it names no file.
"""

from __future__ import annotations

import os
from pathlib import Path

from tmslurm.core.config.schema import RunConfig
from tmslurm.core.errors import ConfigError

ADMIN_PUBLIC_KEY_ENV = "TMSLURM_ADMIN_PUBLIC_KEY_FILE"
"""The environment variable that names the site's admin public key (it wins over the file below)."""
SITE_ADMIN_PUBLIC_KEY = Path("/etc/tmslurm/admin.pub")
"""The site's admin public key when the variable is not set (used only when the file exists)."""


def apply_site_defaults(cfg: RunConfig) -> None:
    """Fill what the run left unset from the site's defaults (see the module's contract)."""
    if cfg.security.admin_public_key_file is None:
        key = site_admin_public_key()
        cfg.security.admin_public_key_file = None if key is None else str(key)


def site_admin_public_key() -> Path | None:
    """The site's admin public key file (absolute), or None when the site has none."""
    named = os.environ.get(ADMIN_PUBLIC_KEY_ENV)
    if named is None:
        return SITE_ADMIN_PUBLIC_KEY if os.path.isfile(SITE_ADMIN_PUBLIC_KEY) else None
    if not named:
        return None
    if not os.path.isfile(named):
        raise ConfigError(
            f"{ADMIN_PUBLIC_KEY_ENV}={named!r} is not a file (the site's admin public key for signed notices). "
            f"Fix: point it at the public key (tmslurm keygen), unset it, or pass security.admin_public_key_file=<key>."
        )
    return Path(os.path.abspath(named))
