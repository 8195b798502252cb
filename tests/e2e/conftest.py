"""Fixtures of the end-to-end tests: a private redis-server each test may stop and start."""

import pytest

from devtools.sandbox import PrivateRedis, pick_port
from tests.conftest import worker_port


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of the test's own on a free loopback port, so it can be killed
    without touching the shared one."""
    redis = PrivateRedis(port=pick_port(worker_port(56479)), directory=tmp_path / "redis")
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()
