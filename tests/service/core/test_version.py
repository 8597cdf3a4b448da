"""The version comes from the installed distribution's metadata, pyproject.toml's one copy."""

from __future__ import annotations

import tomllib

from service.core import version
from tests.conftest import ROOT


def test_the_version_is_pyprojects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == version.DISTRIBUTION
    assert project["version"] == version.VERSION  # the dev environment installs the project (make)


def test_an_uninstalled_tree_says_its_version_is_unknown() -> None:
    assert version.installed_version("patchserve-not-installed") == version.UNINSTALLED == "0+unknown"


def test_the_app_and_v2_report_it() -> None:
    from service.core.settings import Settings
    from service.http.app import create_app

    app = create_app(Settings(model_repository=ROOT / "model_repository", device="cpu"))
    assert app.version == version.VERSION and app.openapi()["info"]["version"] == version.VERSION
