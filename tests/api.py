"""Helpers for API tests: requests through DRF's APIClient, bodies, clocks."""

import json
from datetime import timedelta

from django.utils import timezone

from ledger.models import Account


def future(seconds: float = 3600) -> str:
    return (timezone.now() + timedelta(seconds=seconds)).isoformat()


def post(client, url, body, key=None, **headers):
    """POST ``body`` as JSON (``body`` may be a ready string to send raw)."""
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", **headers)


def patch(client, url, body, **headers):
    """PATCH ``body`` as JSON (``body`` may be a ready string to send raw)."""
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.patch(url, data=data, content_type="application/json", **headers)


def payment_body(source: Account, target: Account, **overrides) -> dict:
    return {"from_account": source.id, "to_account": target.id, "amount": 25, "execute_at": future(), **overrides}


def assert_error(response, status: int, code: str) -> dict:
    """The one error shape: ``{"code", "detail", ...}`` as JSON, with the given status and code."""
    assert response.status_code == status, (response.status_code, response.content)
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["detail"], str) and body["detail"]
    return body
