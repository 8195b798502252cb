"""A real sandbox gateway process (rails/sandbox.py) and a real HttpRail in front of it."""

import uuid

import pytest

from devtools.gateway import SandboxGateway
from rails.http import HttpRail
from rails.registry import close_rails


@pytest.fixture(scope="session")
def shared_gateway(tmp_path_factory):
    """One gateway for the tests that leave it running; each test starts from a reset."""
    with SandboxGateway(db_path=tmp_path_factory.mktemp("gateway") / "gateway.sqlite3") as gateway:
        yield gateway


@pytest.fixture
def gateway(shared_gateway):
    shared_gateway.reset(data=True)
    yield shared_gateway
    shared_gateway.reset(data=True)


@pytest.fixture
def own_gateway(tmp_path):
    """A gateway of the test's own, which it may stop, kill or restart."""
    gateway = SandboxGateway(db_path=tmp_path / "gateway.sqlite3")
    yield gateway
    gateway.close()


@pytest.fixture
def rail(gateway):
    rail = HttpRail(name="sandbox", base_url=gateway.url, timeout=5.0, connections=32)
    yield rail
    rail.close()


@pytest.fixture(autouse=True)
def _no_cached_rails():
    yield
    close_rails()


@pytest.fixture
def key():
    return f"test-{uuid.uuid4().hex}"
