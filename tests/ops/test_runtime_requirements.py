"""requirements.txt alone runs every Procfile process.

A Procfile platform installs requirements.txt into a fresh environment and runs the
Procfile's lines; nothing from requirements-dev.txt is there. These tests do the same: a
venv built from requirements.txt only (cached under var/, keyed by the file's hash, so a
fresh clone builds it once), then every Procfile line loads the application from it, and
a worker, the promoter, beat and web started from it answer. A runtime import that only
the dev requirements satisfy (kombu's Redis transport needed ``packaging``) fails here.
"""

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from devtools.processes import Stack, procfile

# One xdist worker for the module: the venv is built once, under var/, and two workers
# building it at once would remove each other's files.
pytestmark = [
    pytest.mark.processes, pytest.mark.xdist_group("runtime-venv"),
    pytest.mark.django_db(transaction=True), pytest.mark.timeout(900),
]

BASE_DIR = Path(settings.BASE_DIR)

# How each Procfile process proves it loads without running forever. A process type
# missing here fails test_every_procfile_process_is_checked: a new one cannot skip this.
LOAD_CHECKS = {
    "release": "run",  # migrate, staff_groups, collectstatic: runs to completion
    "web": "check-config",  # gunicorn --check-config imports delaypay.wsgi
    "worker": "help",  # celery -A delaypay ... --help imports the app
    "promoter": "help",
    "webhooks": "help",
    "payouts": "help",
    "gateway": "help",  # python -m rails.sandbox --help: the stdlib alone
    "beat": "help",
    "metrics": "help",  # manage.py serve_metrics --help imports Django and the command
    "flower": "help",
}


def runtime_venv() -> Path:
    """A venv holding requirements.txt and nothing else (built once per requirements)."""
    digest = hashlib.sha1((BASE_DIR / "requirements.txt").read_bytes()).hexdigest()[:12]
    venv = BASE_DIR / "var" / f"runtime-venv-{digest}"
    venv.parent.mkdir(exist_ok=True)
    # One builder at a time, whichever test process asks first (xdist workers, two runs):
    # two building the same venv delete each other's files and ensurepip fails.
    with open(venv.parent / f"runtime-venv-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        base_python = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-r", str(BASE_DIR / "requirements.txt")],
            check=True, stdin=subprocess.DEVNULL,
        )
        (venv / ".complete").touch()
    return venv


@pytest.fixture(scope="module")
def venv() -> Path:
    return runtime_venv()


def venv_env(venv: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_runtime_venv_has_no_dev_requirements(venv):
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True, text=True, check=True,
    ).stdout.lower()
    for dev_only in ("pytest", "ruff", "hypothesis", "playwright", "mkdocs"):
        assert f"\n{dev_only}==" not in f"\n{installed}", dev_only


def test_every_procfile_process_is_checked():
    assert set(procfile()) == set(LOAD_CHECKS)


@pytest.mark.parametrize("kind", sorted(LOAD_CHECKS))
def test_each_procfile_line_loads_the_application(kind, venv, tmp_path):
    from devtools.processes import database_url

    line = procfile()[kind].strip()
    how = LOAD_CHECKS[kind]
    if how == "check-config":
        assert line.startswith("gunicorn ")
        line = "gunicorn --check-config " + line.removeprefix("gunicorn ")
    elif how == "help":
        line = f"{line} --help"
    env = venv_env(
        venv,
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
        DELAYPAY_BEAT_SCHEDULE_FILE=str(tmp_path / "beat-schedule"),
    )
    if kind == "release":
        # collectstatic into a directory of its own: in the checkout's staticfiles/ it would
        # delete and rewrite the hashed CSS while tests in other xdist workers read them.
        (tmp_path / "release_settings.py").write_text(
            f"from delaypay.settings import *  # noqa: F403\nSTATIC_ROOT = {str(tmp_path / 'static')!r}\n"
        )
        env.update(DJANGO_SETTINGS_MODULE="release_settings", PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        ["sh", "-c", line], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{kind}: {line}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-4000:]


def test_processes_started_from_requirements_txt_answer(venv, tmp_path):
    """A worker answers `celery inspect ping`; the promoter and beat start; web serves
    /healthz: all from the requirements.txt-only venv, with production settings."""
    port = free_port()
    stack = Stack(tmp_path, env=venv_env(venv, PORT=str(port), WEB_CONCURRENCY="1"))
    try:
        stack.start_worker("worker1", concurrency=1)
        stack.start_promoter()
        stack.start_beat()
        stack._spawn("web", "web")
        stack.wait_ready(["worker1", "promoter", "beat"])
        ping = subprocess.run(
            ["celery", "-A", "delaypay", "inspect", "ping", "--timeout", "10", "-d", f"worker1@{socket.gethostname()}"],
            cwd=BASE_DIR, env=stack.env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )
        assert ping.returncode == 0 and "pong" in ping.stdout, ping.stdout + ping.stderr
        status = None
        deadline = time.monotonic() + 60
        while status is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                    status = response.status
            except OSError:
                if stack.procs["web"].poll() is not None:
                    break
                time.sleep(0.2)
        assert status == 200, stack.log("web")[-3000:]
    finally:
        stack.stop()
