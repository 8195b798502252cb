import functools
import io
import os
import socket
import subprocess
from urllib.parse import urlsplit, urlunsplit

import hypothesis
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection, connections
from django.test import Client, TransactionTestCase, override_settings
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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """Each xdist worker (``-n N``) gets an environment of its own before it imports the
    settings, so that it and every process it starts share nothing with another worker:
    Redis database ``b - i`` for worker ``gw<i>`` when REDIS_URL names database ``b``
    (pyproject's default 15: 15, 14, 13, ...; never 0, which `make run` uses), beat's
    schedule file with a suffix ``-gw<i>``, and that suffix for pyproject.toml's env to put
    on the metrics directory. pytest-django suffixes the test database name itself (``test_delaypay_gw0``).
    Ports are free ones (``tests.workers.worker_port``) and temporary directories are the
    worker's own (pytest's basetemp is per worker)."""
    base = redis.Redis.from_url(os.environ["REDIS_URL"]).connection_pool.connection_kwargs.get("db", 0)
    for index, spec in enumerate(specs):
        worker = spec.id or f"gw{index}"
        db = base - index
        if db < 1:
            raise pytest.UsageError(
                f"{len(specs)} workers need Redis databases {base} down to {base - len(specs) + 1}: "
                "point REDIS_URL at a higher database or run fewer workers (database 0 is `make run`'s)"
            )
        spec.env["REDIS_URL"] = redis_url_with_db(os.environ["REDIS_URL"], db)
        if os.environ.get("DELAYPAY_CACHE_URL"):  # a cache of its own: its database, shifted the same way
            cache = os.environ["DELAYPAY_CACHE_URL"]
            cache_db = redis.Redis.from_url(cache).connection_pool.connection_kwargs.get("db", 0) - index
            spec.env["DELAYPAY_CACHE_URL"] = redis_url_with_db(cache, max(cache_db, 1))
        spec.env["DELAYPAY_TEST_WORKER_SUFFIX"] = f"-{worker}"
        spec.env["DELAYPAY_BEAT_SCHEDULE_FILE"] = f"{os.environ['DELAYPAY_BEAT_SCHEDULE_FILE']}-{worker}"


def worker_port(preferred: int) -> int:
    """A preferred port for ``devtools.sandbox.pick_port`` that no other xdist worker
    prefers: ``preferred + 100 * i`` on worker ``gw<i>`` (pick_port tries 50 ports up from
    it), so two workers never both find the same port free and then race to bind it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return preferred + 100 * int(worker.removeprefix("gw") or 0)


def redis_url_with_db(url: str, db: int) -> str:
    """``url`` pointing at Redis database ``db`` (the path of a redis:// URL is the database)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def pytest_sessionstart(session):
    """Production storage (WhiteNoise's manifest) needs collectstatic, as the release step
    runs. Always run (it only copies what changed) so a manifest from before an app
    with static files was added cannot go stale. At session start, before collection:
    tests/payments/api/test_schemathesis.py builds the WSGI app when it is imported, and WhiteNoise
    warns (an error under -W error) when STATIC_ROOT does not exist yet. Under xdist the
    controller runs it once, before it starts the workers (xdist's own sessionstart is
    trylast), so that workers never write the same files at once."""
    if hasattr(session.config, "workerinput"):
        return
    collect_static_if_changed()


def collect_static_if_changed() -> None:
    """collectstatic, unless every source file (path, size, time) is as the last run saw
    it: it compresses each file again (about 2 s of a test run's CPU) even when nothing
    changed."""
    from pathlib import Path

    from django.contrib.staticfiles.finders import get_finders

    seen = sorted(
        f"{getattr(storage, 'prefix', None) or ''}{path} {stat.st_size} {stat.st_mtime_ns}"
        for finder in get_finders() for path, storage in finder.list([])
        for stat in [os.stat(storage.path(path))]
    )
    stamp = Path(settings.BASE_DIR) / "var" / "test-static-sources"
    fingerprint = "\n".join(seen)
    manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
    if manifest.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        return
    call_command("collectstatic", interactive=False, verbosity=0)
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(fingerprint)


# What the post_migrate signal writes (content types and permissions): the same rows each
# time, so the flush after a transactional test keeps them instead of emptying them and
# having the signal write every one of them again (a third of each flush's time).
KEPT_BY_FLUSH = {"django_content_type", "auth_permission"}


def _fixture_teardown(self):
    """Django's flush (TRUNCATE every table, as pytest-django asks for), less KEPT_BY_FLUSH
    and the post_migrate signal."""
    for name in self._databases_names(include_mirrors=False):
        connection = connections[name]
        tables = sorted(set(connection.introspection.django_table_names(only_existing=True)) - KEPT_BY_FLUSH)
        connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables))


TransactionTestCase._fixture_teardown = _fixture_teardown


# A test that asks for one of these fixtures runs with child processes (Celery, the sandbox
# gateway, a redis-server or PostgreSQL cluster of its own, Chromium): it is marked
# ``processes``, as are e2e and browser tests, and modules that start processes themselves
# say so with ``pytestmark``. `make test-fast` (-m "not processes") leaves them out.
PROCESS_FIXTURES = {"celery_stack", "sandbox_gateway", "private_redis", "pg_pair", "live_server"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        # schemathesis names each operation's item (test_x[GET /payments]) but, under pytest
        # 9, gives them all the function's node id; xdist's --dist loadgroup queues by node
        # id and would run one item of the 39. The name goes back into the id.
        if item.name != item.nodeid.rsplit("::", 1)[-1].split("@", 1)[0]:
            item._id = type(item._id).parse(f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}")
        # --dist loadgroup keeps the items whose node id ends in "@<group>" on one worker.
        # xdist 3.8 writes that suffix to item._nodeid, which pytest 9 no longer reads (the
        # node id is str(item._id)): the groups were lost and two workers built the same
        # runtime venv at once. The suffix goes into the id.
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and config.getoption("loadgroup", False) and "@" not in item.nodeid.rsplit("::", 1)[-1]:
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(groups)}")
        if item.path.parent.name == "console" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.console)
        if PROCESS_FIXTURES.intersection(item.fixturenames) or item.get_closest_marker("e2e") \
                or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.processes)


@pytest.fixture(autouse=True)
def _no_child_processes(request, monkeypatch):
    """In a run that leaves out the ``processes`` tests (`make test-fast`), a test that
    starts a process anyway fails and says to mark it, so the fast selection stays what
    it claims to be."""
    if "not processes" not in (request.config.option.markexpr or ""):
        return

    def refuse(self, args, *rest, **kwargs):
        pytest.fail(f"this test starts a process ({args!r}): mark it @pytest.mark.processes", pytrace=False)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


@pytest.fixture(scope="session", autouse=True)
def _static_files_scanned_once():
    """WhiteNoise's middleware scans STATIC_ROOT (hundreds of files: a stat each and a
    look for compressed twins) whenever a middleware chain is built, that is for every
    test client: 50-140 ms a client, a good part of the fast tests' time. The files do
    not change during a run (collectstatic runs once, before the workers start:
    pytest_sessionstart), so each directory is scanned once a process and later chains
    get the same entries. Production builds its chain once a process, as before."""
    from whitenoise.base import WhiteNoise

    scan = WhiteNoise.update_files_dictionary
    scanned: dict[tuple[str, str], dict] = {}

    def scanned_once(self, root, prefix):
        if (root, prefix) not in scanned:
            before = dict(self.files)
            scan(self, root, prefix)
            scanned[root, prefix] = {url: f for url, f in self.files.items() if before.get(url) is not f}
        self.files.update(scanned[root, prefix])

    WhiteNoise.update_files_dictionary = scanned_once
    yield
    WhiteNoise.update_files_dictionary = scan


@pytest.fixture(autouse=True)
def _empty_cache():
    """Throttle counters live in the cache (Redis, the tests' database): start every test
    from zero so one test's requests never throttle another's."""
    flush_test_redis(settings.CACHES["default"]["LOCATION"])


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing():
    override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]).enable()


# Whether the system accounts and rail states are in the database, committed. A test
# inside a transaction (``db``) leaves them as it found them; a transactional test's
# teardown empties every table.
_system_rows = {"present": False}


@pytest.fixture(autouse=True)
def _issuance_account(request, django_db_blocker):
    """The issuance account and each rail's accounts and state come from data migrations
    (ledger, payments/0014); a transactional test's teardown empties every table, so they
    are put back, committed, before the next test that uses the database."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        return
    transactional = marker.kwargs.get("transaction", False) or (bool(marker.args) and marker.args[0])
    if not _system_rows["present"]:
        request.getfixturevalue("django_db_setup")
        ensure_system_rows(django_db_blocker)
    if transactional:
        _system_rows["present"] = False  # its teardown flushes them
    request.getfixturevalue("transactional_db" if transactional else "db")


def ensure_system_rows(django_db_blocker) -> None:
    """Put the system rows back, committed; a module's shared world (built inside a
    transaction that outlives its tests) calls this before it starts that transaction."""
    with django_db_blocker.unblock():
        put_back_system_rows()
        # Inside a module's transaction they go when it is rolled back.
        _system_rows["present"] = not connection.in_atomic_block


def put_back_system_rows() -> None:
    accounts = [Account(id=ISSUANCE_ACCOUNT_ID, name="Issuance", kind=Account.Kind.SYSTEM)] + [
        Account(id=f"acc_{rail}_{role}", name=f"{rail} {role}", kind=Account.Kind.SYSTEM)
        for rail in Rail.values for role in ("clearing", "settlement")
    ]
    Account.objects.bulk_create(accounts, ignore_conflicts=True)
    RailState.objects.bulk_create([RailState(rail=rail) for rail in Rail.values], ignore_conflicts=True)


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


@pytest.fixture
def no_sockets(monkeypatch):
    """Fail the test if anything tries to connect (the address checks must refuse before
    any socket opens). The refused socket is closed before the failure is raised: left
    open, the garbage collector would close it at some later instant, and its
    ResourceWarning would fail whichever test is running then, not this one (as a socket
    that never connected once failed a property test in CI)."""

    def refuse(self, address):
        self.close()
        raise AssertionError(f"a socket was opened to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def flush_test_redis(url: str | None = None) -> None:
    """Empty the Redis database the tests use (never database 0, which `make run` uses)."""
    _test_redis(url or settings.REDIS_URL).flushdb()


@functools.cache
def _test_redis(url: str) -> redis.Redis:
    """One client (and its connection) per URL for the whole test process."""
    client = redis.Redis.from_url(url)
    if client.connection_pool.connection_kwargs.get("db", 0) == 0:
        raise RuntimeError("refusing to flush Redis database 0: point REDIS_URL at a test database")
    return client


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
