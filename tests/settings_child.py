"""delaypay's settings imported in a child Python with a test environment: for settings
that refuse a bad value at import (ImproperlyConfigured), which this process could not
import again."""

import os
import subprocess  # nosec B404: the settings module is imported in a child with a test environment
import sys

from django.conf import settings


def settings_in_child(code: str, **environ: str | None) -> subprocess.CompletedProcess:
    """Run ``code`` (which imports django.conf.settings) in a child whose environment has
    ``environ`` set (None: unset)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "delaypay.settings"}
    env.setdefault("DJANGO_SECRET_KEY", settings.SECRET_KEY)
    for name, value in environ.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return subprocess.run(  # nosec B603: a fixed command line
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
