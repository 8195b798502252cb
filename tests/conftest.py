import io
import os

import hypothesis
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from knox.models import AuthToken
from rest_framework.test import APIClient

from devtools.processes import Stack
from ledger.models import ISSUANCE_ACCOUNT_ID, Account
from payments.models import Rail, RailState

from .factories import UserFactory

# Property-based tests run the same examples on every run ("ci", the default), so CI
# cannot flake on a new random draw; HYPOTHESIS_PROFILE=explore draws fresh ones and keeps
# failures in .hypothesis/ for the next run.
hypothesis.settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
hypothesis.settings.register_profile("explore", deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_sessionstart(session):
    """Production storage (WhiteNoise's manifest) needs collectstatic, as the release step
    runs. Always run (it only copies what changed) so a manifest from before an app
    with static files was added cannot go stale. At session start, before collection:
    tests/payments/api/test_schemathesis.py builds the WSGI app when it is imported, and WhiteNoise
    warns (an error under -W error) when STATIC_ROOT does not exist yet."""
    call_command("collectstatic", interactive=False, verbosity=0)


@pytest.fixture(autouse=True)
def _empty_cache():
    """Throttle counters live in the cache (Redis, the tests' database): start every test
    from zero so one test's requests never throttle another's."""
    flush_test_redis(settings.CACHES["default"]["LOCATION"])


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _issuance_account(request):
    """The issuance account comes from a data migration; transactional tests flush
    every table between tests, so put it back for each test that uses the database."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        return
    transactional = marker.kwargs.get("transaction", False) or (bool(marker.args) and marker.args[0])
    request.getfixturevalue("transactional_db" if transactional else "db")
    Account.objects.get_or_create(
        id=ISSUANCE_ACCOUNT_ID, defaults={"name": "Issuance", "kind": Account.Kind.SYSTEM}
    )
    for rail in Rail.values:  # and each rail's accounts and state (payments/0014)
        for role in ("clearing", "settlement"):
            Account.objects.get_or_create(
                id=f"acc_{rail}_{role}", defaults={"name": f"{rail} {role}", "kind": Account.Kind.SYSTEM}
            )
        RailState.objects.get_or_create(rail=rail)


@pytest.fixture
def fast_rail(rail_gateway, settings):
    """The sandbox rail unpaced (a full bucket, a high limit) and with short timeouts."""
    settings.DELAYPAY_RAIL_RATE_LIMIT = 10_000
    settings.DELAYPAY_RAIL_TIMEOUT_SECONDS = 2.0
    RailState.objects.filter(rail="sandbox").update(tokens=10_000)
    return rail_gateway


@pytest.fixture(scope="session")
def sandbox_gateway(tmp_path_factory):
    """The sandbox gateway (rails/sandbox.py) as a real process on a free loopback port,
    shared by the session; ``rail_gateway`` points the product at it, reset."""
    from devtools.gateway import SandboxGateway

    with SandboxGateway(db_path=tmp_path_factory.mktemp("gateway") / "gateway.sqlite3") as gateway:
        yield gateway


@pytest.fixture
def rail_gateway(sandbox_gateway, settings):
    from rails.registry import close_rails

    sandbox_gateway.reset(data=True)
    settings.DELAYPAY_RAIL_SANDBOX_URL = sandbox_gateway.url
    close_rails()
    yield sandbox_gateway
    close_rails()
    sandbox_gateway.reset(data=True)


@pytest.fixture
def user(db):
    return UserFactory()


@pytest.fixture
def other_user(db):
    return UserFactory()


@pytest.fixture
def staff_user(db):
    """Staff who may deposit into any account: ``ledger.deposit_account``, and
    ``ledger.view_account`` to reach someone else's account (common/authz.py)."""
    from django.contrib.auth.models import Permission

    user = UserFactory(is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["deposit_account", "view_account"], content_type__app_label="ledger")
    )
    return user


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        _, key = AuthToken.objects.create(user)  # a new API token (knox), as POST /auth/token issues
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def api(user):
    return client_for(user)


@pytest.fixture
def staff_api(staff_user):
    return client_for(staff_user)


def flush_test_redis(url: str | None = None) -> None:
    """Empty the Redis database the tests use (never database 0, which `make run` uses)."""
    client = redis.Redis.from_url(url or settings.REDIS_URL)
    if client.connection_pool.connection_kwargs.get("db", 0) == 0:
        raise RuntimeError("refusing to flush Redis database 0: point REDIS_URL at a test database")
    client.flushdb()


@pytest.fixture
def celery_stack(request, transactional_db, tmp_path):
    """Real `celery worker` (execute queue), promoter worker and `celery beat`
    processes against the test database and a private Redis database."""
    flush_test_redis()
    stack = Stack(tmp_path, env=request.param if hasattr(request, "param") else None)
    try:
        yield stack
    finally:
        stack.stop()


# --- The admin console ------------------------------------------------------------------


@pytest.fixture
def staff_groups(db):
    """The "support" and "auditor" groups, as the release step creates them."""
    call_command("staff_groups", stdout=io.StringIO())


def admin_client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff_in(group: str):
    user = UserFactory(is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def superuser(db):
    return UserFactory(is_staff=True, is_superuser=True)


@pytest.fixture
def support_user(staff_groups):
    return staff_in("support")


@pytest.fixture
def auditor_user(staff_groups):
    return staff_in("auditor")
