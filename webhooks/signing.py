"""Standard Webhooks signatures (https://www.standardwebhooks.com/), computed by the
``standardwebhooks`` library: ``webhook-signature`` is ``v1,<base64 HMAC-SHA256 of
id.timestamp.body>``, one per secret that is signing (during a rotation the new one and
the previous one, space separated: a receiver that knows either verifies)."""

from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook


def signed_headers(*, msg_id: str, body: str, secrets: list[str], timestamp: datetime | None = None) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``, signed with each of ``secrets``."""
    timestamp = timestamp or datetime.now(UTC)
    signatures = [Webhook(secret).sign(msg_id=msg_id, timestamp=timestamp, data=body) for secret in secrets]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": " ".join(signatures),
    }
