"""One version: delaypay/__init__.py writes it; pyproject.toml reads it from there, the
OpenAPI schema's info.version is it, and CHANGELOG.md's latest release names it."""

import re
import tomllib
from pathlib import Path

import pytest
from drf_spectacular.generators import SchemaGenerator
from setuptools.config.expand import read_attr

import delaypay

ROOT = Path(__file__).resolve().parents[2]

# A release heading of Keep a Changelog: "## [0.1.0] - 2026-12-04".
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", re.M)


def changelog_releases(text: str) -> list[str]:
    """The versions the changelog's release headings name, newest first."""
    return RELEASE.findall(text)


def test_pyproject_reads_the_version_from_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "the version is written once, in delaypay/__init__.py"
    assert project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    # The resolution a build makes (setuptools reads the literal without importing).
    assert read_attr(attr, root_dir=ROOT) == delaypay.__version__


def test_the_openapi_schema_states_the_version():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert schema["info"]["version"] == delaypay.__version__


def test_the_changelog_latest_release_is_the_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]$", text, re.M), "an Unreleased section above the releases"
    assert text.index("## [Unreleased]") < text.index("\n## [" + delaypay.__version__ + "]")
    releases = changelog_releases(text)
    assert releases and releases[0] == delaypay.__version__
    assert f"`v{delaypay.__version__}`" in text, "the release names its tag"


@pytest.mark.parametrize(
    ("text", "latest"),
    [
        ("## [Unreleased]\n\n## [0.2.0] - 2027-01-05\n\n## [0.1.0] - 2026-12-04\n", "0.2.0"),
        ("## [Unreleased]\n\n## [1.0.0] - 2027-01-05\n", "1.0.0"),
    ],
)
def test_the_changelog_check_reads_the_newest_release_heading(text, latest):
    """The check can fail: a changelog whose newest release is another version names it."""
    assert changelog_releases(text)[0] == latest != delaypay.__version__
