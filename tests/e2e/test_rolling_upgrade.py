"""A rolling deploy, half-way: the previous release's worker, promoter and beat (its own
source, from git, with its own Procfile) run on this release's schema while this
release's web serves the API. Nothing fails and nothing runs twice: every payment, made
through the new API or written before, is executed once, the books reconcile, and the old
processes log no error.

The previous release is the newest one in CHANGELOG.md; its commit is its tag
``v<version>`` or, in a clone without tags, the commit that set ``__version__`` to it.
"""

import json
import re
import subprocess
import sys
import tarfile
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from knox.models import AuthToken

from devtools.gateway import free_port
from devtools.processes import BASE_DIR, Stack
from ledger.models import Transfer
from payments.models import PaymentStatus, ScheduledPayment
from payments.reconciliation import reconcile
from tests.concurrency import wait_until
from tests.factories import due_payment, funded_account

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
OLD = ("worker", "promoter", "beat")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=BASE_DIR, capture_output=True, text=True, check=True).stdout.strip()


def previous_release() -> tuple[str, str]:
    """(version, commit) of the newest release in the changelog."""
    version = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (BASE_DIR / "CHANGELOG.md").read_text(), re.M).group(1)
    tag = f"v{version}"
    if tag in git("tag", "--list", tag).splitlines():
        return version, git("rev-parse", f"{tag}^{{commit}}")
    found = git("log", "--format=%H", f"-S__version__ = \"{version}\"", "--", "delaypay/__init__.py").splitlines()
    assert found, f"neither the tag {tag} nor the commit that set version {version} is in this clone's history"
    return version, found[-1]


@pytest.fixture(scope="module")
def old_release(tmp_path_factory) -> Path:
    """The previous release's source tree (``git archive``), outside this checkout."""
    version, commit = previous_release()
    directory = tmp_path_factory.mktemp(f"delaypay-{version}")
    archive = directory / "release.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit], cwd=BASE_DIR, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(directory / "src", filter="data")
    assert f'__version__ = "{version}"' in (directory / "src/delaypay/__init__.py").read_text()
    return directory / "src"


def errors_logged(stack: Stack, names) -> list[str]:
    lines = []
    for name in names:
        for line in stack.log(name).splitlines():
            if line.startswith("{") and json.loads(line).get("level") in ("ERROR", "CRITICAL"):
                lines.append(f"{name}: {line[:400]}")
            elif "Traceback" in line:
                lines.append(f"{name}: {line[:400]}")
    return lines


def test_the_previous_releases_workers_run_on_the_new_schema_while_the_new_web_serves(old_release, tmp_path):
    metrics = {"PROMETHEUS_MULTIPROC_DIR": str((tmp_path / "metrics").resolve())}
    (tmp_path / "metrics").mkdir()
    old = Stack(tmp_path / "old", env=metrics, base_dir=old_release)
    new = Stack(tmp_path / "new", env=metrics)
    try:
        # The old processes import the old code, not this checkout's.
        where = subprocess.run([sys.executable, "-c", "import payments; print(payments.__file__)"],
                               cwd=old_release, env=old.env, capture_output=True, text=True, check=True)
        assert Path(where.stdout.strip()).is_relative_to(old_release), where.stdout
        old.start_all()
        old.wait_ready(["worker1", "promoter", "beat"])
        port = free_port()
        new.start_web(port)

        payer = funded_account(balance=10_000)
        payee = funded_account(owner=payer.owner)
        _, token = AuthToken.objects.create(payer.owner)
        written = [due_payment(source=payer, target=payee, amount=1) for _ in range(10)]
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{base}/healthz"), timeout=60, stack=new, what="the new web to answer")
        made = []
        with httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=10) as client:
            for i in range(10):
                due = (timezone.now() + timedelta(seconds=2)).isoformat()
                response = client.post("/api/v1/payments", headers={"Idempotency-Key": f"upgrade-{i}"},
                                       json={"from_account": payer.id, "to_account": payee.id, "amount": 1,
                                             "execute_at": due})
                assert response.status_code == 201, response.text
                made.append(response.json()["payment_id"])
        ids = [p.id for p in written] + made

        def all_executed() -> bool:
            return ScheduledPayment.objects.filter(pk__in=ids, status=PaymentStatus.EXECUTED).count() == len(ids)

        wait_until(all_executed, timeout=90, stack=old, what="the old release to execute every payment")
        time.sleep(2)  # a second execution or a late error would show itself here
        assert Transfer.objects.filter(key__in=ids).count() == len(ids)  # a payment's transfer key is its id
        payer.refresh_from_db()
        assert payer.balance == 10_000 - len(ids)
        assert reconcile().ok
        assert errors_logged(old, ["worker1", "promoter", "beat"]) == []
        assert errors_logged(new, ["web"]) == []
    finally:
        old.stop()
        new.stop()


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
