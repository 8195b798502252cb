"""devtools.processes: a killed harness (bench, chaos) takes its children with it."""

import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings

pytestmark = pytest.mark.processes

# A harness in miniature: a child in a session of its own (as Stack starts the Procfile's
# processes), stopped in a ``finally``.
HARNESS = """
import subprocess, time
import django
django.setup()
from devtools.processes import stop_children_on_sigterm
stop_children_on_sigterm()
child = subprocess.Popen(["sleep", "120"], start_new_session=True)
try:
    print(child.pid, flush=True)
    time.sleep(120)
finally:
    child.kill()
    child.wait()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_runs_the_finally_that_stops_the_children():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "delaypay.settings"}
    with subprocess.Popen(  # the test's own interpreter and snippet (bandit B603)
        [sys.executable, "-c", HARNESS], cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, text=True
    ) as harness:
        try:
            child = int(harness.stdout.readline())
            assert alive(child)
            harness.send_signal(signal.SIGTERM)
            assert harness.wait(timeout=30) != 0
        finally:
            harness.kill()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the child outlived its harness"
