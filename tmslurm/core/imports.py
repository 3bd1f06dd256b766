"""Importing a class named in the configuration as ``package.module:ClassName``.

Contract: :func:`import_class` returns the class; a spec without ``:``, a module that cannot be
imported (or raises while importing: ImportError, SyntaxError and the like are reported, not
raised) or a name that is not a class in it raises
:class:`~tmslurm.core.errors.ConfigError` naming the setting and its fix. It is the one place such
a spec is resolved.
"""

from __future__ import annotations

import importlib

from tmslurm.core.errors import ConfigError


def import_class(spec: str, setting: str) -> type:
    """The class ``spec`` (``package.module:ClassName``) names; ``setting`` is the override that gave it."""
    module_name, _, cls_name = spec.partition(":")
    try:
        if not module_name or not cls_name:
            raise ImportError("expected package.module:ClassName")
        cls = getattr(importlib.import_module(module_name), cls_name, None)
        if not isinstance(cls, type):
            raise ImportError(f"no class {cls_name!r} in {module_name}")
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"{setting}={spec!r} cannot be imported ({exc}). Fix: pass {setting}=package.module:ClassName"
        ) from None
    return cls
