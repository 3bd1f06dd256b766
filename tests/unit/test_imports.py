"""tmslurm.core.imports.import_class: a ``module:Class`` spec gives its class, or a ConfigError naming the setting."""

from __future__ import annotations

import pytest

from tmslurm.core.errors import ConfigError
from tmslurm.core.imports import import_class


def test_a_spec_resolves_to_its_class():
    assert import_class("pathlib:PurePath", "train.task").__name__ == "PurePath"


@pytest.mark.parametrize(
    "spec, why",
    [
        ("pathlib.PurePath", "expected package.module:ClassName"),
        ("no_such_module_x:Task", "No module named"),
        ("pathlib:NoSuchClass", "no class 'NoSuchClass'"),
        ("os.path:join", "no class 'join'"),
    ],
)
def test_a_bad_spec_names_the_setting_and_the_fix(spec, why):
    with pytest.raises(ConfigError, match="train.task=") as err:
        import_class(spec, "train.task")
    assert why in str(err.value) and "Fix: pass train.task=package.module:ClassName" in str(err.value)
