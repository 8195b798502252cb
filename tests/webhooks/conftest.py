import pytest

from .receiver import Receiver


@pytest.fixture
def receiver(settings):
    """A loopback receiver, with 127.0.0.1 allowed as a webhook host."""
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    started = Receiver().start()
    try:
        yield started
    finally:
        started.stop()
