# The one place the release version is written: pyproject.toml reads it
# ([tool.setuptools.dynamic]), the OpenAPI schema's info.version is it (settings.py), and
# CHANGELOG.md's latest release must name it (tests/ops/test_version.py).
__version__ = "0.1.0"

from .celery import app as celery_app

__all__ = ("__version__", "celery_app")
