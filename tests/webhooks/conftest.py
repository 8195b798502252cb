import pytest

from webhooks.dispatcher import close_http_client

from .receiver import Receiver


@pytest.fixture
def receiver(settings):
    """A loopback receiver, with 127.0.0.1 allowed as a webhook host."""
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    started = Receiver().start()
    try:
        yield started
    finally:
        close_http_client()  # its pooled connections point at this receiver
        started.stop()
