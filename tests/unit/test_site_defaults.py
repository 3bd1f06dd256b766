"""The site's admin public key: a run that sets no ``security.admin_public_key_file`` gets the site's,
resolved at composition and recorded in config.json."""

from __future__ import annotations

import json

import pytest

from tmslurm.core.config import RunConfig, compose_config, site
from tmslurm.core.errors import ConfigError
from tmslurm.core.signing import generate_keypair
from tmslurm.run.prepare import prepare_run_dir

BASE = ["cluster=local", "model=tiny"]


@pytest.fixture
def key(tmp_path):
    pub = tmp_path / "keys" / "admin.pub"
    pub.parent.mkdir()
    generate_keypair(tmp_path / "keys" / "admin.key", pub)
    return pub


@pytest.fixture
def no_site_file(tmp_path, monkeypatch):
    """The machine's own /etc/tmslurm/admin.pub, if any, plays no part."""
    monkeypatch.setattr(site, "SITE_ADMIN_PUBLIC_KEY", tmp_path / "etc" / "admin.pub")
    monkeypatch.delenv(site.ADMIN_PUBLIC_KEY_ENV, raising=False)
    return tmp_path / "etc" / "admin.pub"


def test_the_variable_names_the_key_and_config_json_records_its_absolute_path(key, tmp_path, monkeypatch, no_site_file):
    monkeypatch.chdir(key.parent)
    monkeypatch.setenv(site.ADMIN_PUBLIC_KEY_ENV, "admin.pub")  # relative to where the run is launched
    cfg = compose_config([*BASE, f"run_dir={tmp_path / 'run'}"])
    assert cfg.security.admin_public_key_file == str(key)
    run_dir = prepare_run_dir(cfg)
    assert json.loads((run_dir / "config.json").read_text())["security"]["admin_public_key_file"] == str(key)


def test_the_site_file_is_the_default_when_the_variable_is_unset(key, no_site_file):
    assert compose_config(BASE).security.admin_public_key_file is None  # no file there: no key
    no_site_file.parent.mkdir()
    no_site_file.write_bytes(key.read_bytes())
    assert compose_config(BASE).security.admin_public_key_file == str(no_site_file)


def test_the_variable_set_but_empty_means_no_site_key(key, monkeypatch, no_site_file):
    no_site_file.parent.mkdir()
    no_site_file.write_bytes(key.read_bytes())
    monkeypatch.setenv(site.ADMIN_PUBLIC_KEY_ENV, "")
    assert compose_config(BASE).security.admin_public_key_file is None


@pytest.mark.parametrize("own", ["", "mine.pub"], ids=["opted-out", "own-key"])
def test_the_runs_own_setting_wins(key, monkeypatch, no_site_file, own):
    monkeypatch.setenv(site.ADMIN_PUBLIC_KEY_ENV, str(key))
    cfg = compose_config([*BASE, f"security.admin_public_key_file='{own}'"])
    assert cfg.security.admin_public_key_file == own


def test_a_variable_naming_no_file_is_a_config_error_that_names_it(tmp_path, monkeypatch, no_site_file):
    monkeypatch.setenv(site.ADMIN_PUBLIC_KEY_ENV, str(tmp_path / "missing.pub"))
    with pytest.raises(ConfigError, match=f"{site.ADMIN_PUBLIC_KEY_ENV}=.*missing.pub' is not a file.*Fix"):
        compose_config(BASE)


def test_a_config_built_by_hand_gets_the_site_key_too(key, monkeypatch, no_site_file):
    monkeypatch.setenv(site.ADMIN_PUBLIC_KEY_ENV, str(key))
    cfg = RunConfig()
    site.apply_site_defaults(cfg)
    assert cfg.security.admin_public_key_file == str(key)
