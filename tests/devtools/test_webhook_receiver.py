"""The receiver the end-to-end tests, the chaos run and the benchmark deliver to: a real
process that verifies with the standardwebhooks library and fails the first tries."""

import base64
import json
import os
from datetime import UTC, datetime

import httpx
import pytest
from standardwebhooks import Webhook

from devtools.webhook_receiver import ReceiverProcess, read_log, summarize

pytestmark = pytest.mark.processes  # each test starts the receiver as a process


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def send(client, url, *, msg_id, secrets, data=None):
    body = json.dumps({"id": msg_id, "type": "payment.executed", "data": data or {"payment_id": "pay_1", "version": 2}})
    now = datetime.now(UTC)
    signature = " ".join(Webhook(s).sign(msg_id, now, body) for s in secrets)
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    return client.post(url, content=body, headers=headers).status_code


@pytest.fixture
def client():
    with httpx.Client(timeout=5) as c:
        yield c


def test_fails_the_first_tries_of_each_id_then_answers_200_and_logs_every_request(tmp_path, client):
    secret = new_secret()
    with ReceiverProcess(log=tmp_path / "log.jsonl", secrets=[secret], fail_first=2) as receiver:
        assert [send(client, receiver.url, msg_id="evt_1", secrets=[secret]) for _ in range(4)] == [500, 500, 200, 200]
        assert send(client, receiver.url, msg_id="evt_2", secrets=[secret]) == 500
        assert receiver.stats() == {"requests": 5, "inflight": 0, "ids": 2, "delivered": 1}
    summary = receiver.summary()
    assert summary.all_verified and summary.delivered == {"evt_1"}
    assert summary.tries("evt_1") == [500, 500, 200, 200]
    entry = read_log(tmp_path / "log.jsonl")[0]
    assert {k: entry[k] for k in ("webhook_id", "type", "payment_id", "version", "verified", "status", "try")} == {
        "webhook_id": "evt_1",
        "type": "payment.executed",
        "payment_id": "pay_1",
        "version": 2,
        "verified": True,
        "status": 500,
        "try": 1,
    }


def test_refuses_a_wrong_signature_and_accepts_secrets_added_to_its_file_later(tmp_path, client):
    known, later = new_secret(), new_secret()
    secrets = tmp_path / "secrets"
    with ReceiverProcess(log=tmp_path / "log.jsonl", secrets=[known], secret_file=secrets) as receiver:
        assert send(client, receiver.url, msg_id="evt_1", secrets=[later]) == 401
        receiver.add_secrets(later)
        assert send(client, receiver.url, msg_id="evt_1", secrets=[later]) == 200
        # During a rotation both signatures come: either one verifies.
        assert send(client, receiver.url, msg_id="evt_2", secrets=[new_secret(), known]) == 200
    summary = receiver.summary()
    assert summary.unverified == 1 and not summary.all_verified
    assert summary.delivered == {"evt_1", "evt_2"}
    assert [e["signatures"] for e in receiver.entries()] == [1, 1, 2]


def test_a_restarted_receiver_keeps_its_port_and_a_half_written_line_is_skipped(tmp_path, client):
    secret = new_secret()
    log = tmp_path / "log.jsonl"
    receiver = ReceiverProcess(log=log, secrets=[secret]).start()
    try:
        url = receiver.url
        assert send(client, url, msg_id="evt_1", secrets=[secret]) == 200
        receiver.kill()
        with open(log, "a") as lines:
            lines.write('{"webhook_id": "evt_cut')  # what a SIGKILL mid-write leaves
        receiver.start()
        assert receiver.url == url
        assert send(client, url, msg_id="evt_2", secrets=[secret]) == 200
    finally:
        receiver.stop()
    assert summarize(read_log(log)).delivered == {"evt_1", "evt_2"}


def test_fail_share_fails_the_first_try_of_some_ids_only_and_always_the_same_ones(tmp_path, client):
    secret = new_secret()
    ids = [f"evt_{i}" for i in range(40)]
    with ReceiverProcess(log=tmp_path / "log.jsonl", secrets=[secret], fail_first=1, fail_share=0.5) as receiver:
        first = {i: send(client, receiver.url, msg_id=i, secrets=[secret]) for i in ids}
        assert {send(client, receiver.url, msg_id=i, secrets=[secret]) for i in ids} == {200}
    failed = {i for i, status in first.items() if status == 500}
    assert 0 < len(failed) < len(ids)
    with ReceiverProcess(log=tmp_path / "again.jsonl", secrets=[secret], fail_first=1, fail_share=0.5) as again:
        assert {i for i in ids if send(client, again.url, msg_id=i, secrets=[secret]) == 500} == failed
