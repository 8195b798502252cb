"""The sandbox gateway's HTTP contract (docs/reference/rail-contract.md), spoken raw."""

import csv
import io
import json
import socket
from datetime import UTC, datetime

import httpx
import pytest

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]


@pytest.fixture
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=10.0, trust_env=False) as client:
        yield client


def pay(http, key, amount=500, destination="acct_1", **extra):
    body = {"amount": amount, "currency": "RBX", "destination": destination, **extra}
    return http.post("/v1/payouts", json=body, headers={"Idempotency-Key": key})


def test_new_key_pays_with_201_and_replay_answers_200_with_the_same_payout(gateway, http, key):
    first = pay(http, key, metadata={"payment": "p1"})
    assert first.status_code == 201
    payout = first.json()
    assert payout["object"] == "payout" and payout["status"] == "paid" and payout["id"].startswith("po_")
    assert (payout["amount"], payout["currency"], payout["destination"]) == (500, "RBX", "acct_1")
    assert payout["idempotency_key"] == key
    assert datetime.strptime(payout["created"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert "Idempotent-Replayed" not in first.headers

    again = pay(http, key)
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == payout
    assert gateway.payouts(key)["count"] == 1


def test_same_key_with_another_amount_or_destination_is_409(gateway, http, key):
    assert pay(http, key).status_code == 201
    for response in (pay(http, key, amount=501), pay(http, key, destination="acct_2")):
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert gateway.payouts(key)["count"] == 1
    assert len(gateway.payouts(key)["payouts"]) == 1


def test_magic_destination_declines_and_replays_the_decline(gateway, http, key):
    first = pay(http, key, destination="decline-closed")
    assert first.status_code == 402
    body = first.json()
    assert body["error"]["code"] == "payout_declined"
    assert body["error"]["decline_code"] == "account_closed"
    assert body["payout"]["status"] == "declined" and body["payout"]["idempotency_key"] == key
    again = pay(http, key, destination="decline-closed")
    assert again.status_code == 402
    assert again.json()["payout"] == body["payout"]
    assert gateway.payouts(key) | {"payouts": None} == {
        "idempotency_key": key,
        "count": 0,
        "declined": 1,
        "payouts": None,
    }


def test_decline_rate_one_declines_do_not_honor(gateway, http, key):
    gateway.faults(decline_rate=1)
    response = pay(http, key)
    assert response.status_code == 402
    assert response.json()["error"]["decline_code"] == "do_not_honor"


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({}, {"amount": 5, "currency": "RBX", "destination": "acct_1"}),  # no Idempotency-Key
        ({"Idempotency-Key": "k" * 256}, {"amount": 5, "currency": "RBX", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": 0, "currency": "RBX", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": -5, "currency": "RBX", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": 1.5, "currency": "RBX", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": True, "currency": "RBX", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": "5", "currency": "RBX", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": 5, "currency": "EUR", "destination": "acct_1"}),
        ({"Idempotency-Key": "k"}, {"amount": 5, "currency": "RBX", "destination": "acct 1"}),
        ({"Idempotency-Key": "k"}, {"amount": 5, "currency": "RBX", "destination": "a" * 65}),
        ({"Idempotency-Key": "k"}, {"amount": 5, "currency": "RBX", "destination": ""}),
        ({"Idempotency-Key": "k"}, {"amount": 5, "currency": "RBX", "destination": "acct_1", "metadata": []}),
        ({"Idempotency-Key": "k"}, [1, 2]),
    ],
)
def test_bad_payout_requests_are_400_and_not_recorded(gateway, http, headers, body):
    response = http.post("/v1/payouts", json=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert gateway.summary() == {"count": 0, "declined": 0, "duplicates": []}


def test_malformed_json_is_400(gateway, http):
    response = http.post("/v1/payouts", content=b"{not json", headers={"Idempotency-Key": "k"})
    assert response.status_code == 400
    assert gateway.summary()["count"] == 0


def test_list_by_key_holds_paid_and_declined_payouts(http, key):
    assert http.get("/v1/payouts", params={"idempotency_key": key}).json() == {"object": "list", "data": []}
    payout = pay(http, key).json()
    assert http.get("/v1/payouts", params={"idempotency_key": key}).json()["data"] == [payout]
    declined = pay(http, f"{key}-d", destination="decline-x").json()["payout"]
    assert http.get("/v1/payouts", params={"idempotency_key": f"{key}-d"}).json()["data"] == [declined]
    assert http.get("/v1/payouts").status_code == 400


def test_settlement_csv_lists_the_days_paid_payouts_in_order(gateway, http, key):
    paid = [pay(http, f"{key}-{n}", amount=100 + n).json() for n in range(3)]
    pay(http, f"{key}-declined", destination="decline-closed")
    day = paid[0]["created"][:10]
    response = http.get(f"/v1/settlements/{day}")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0] == ["id", "idempotency_key", "amount", "currency", "destination", "status", "created"]
    same_day = [p for p in paid if p["created"][:10] == day]  # a run across midnight UTC splits them
    assert rows[1:] == [
        [p["id"], p["idempotency_key"], str(p["amount"]), "RBX", p["destination"], "paid", p["created"]]
        for p in same_day
    ]
    assert http.get("/v1/settlements/1999-01-01").text.count("\n") == 1  # the header only


@pytest.mark.parametrize("day", ["2026-13-01", "yesterday", "2026-1-1", "2026-02-30"])
def test_settlement_of_a_bad_day_is_400(http, day):
    assert http.get(f"/v1/settlements/{day}").status_code == 400


def test_faults_validate_and_reset(gateway, http):
    assert http.get("/_sandbox/faults").json() == {
        "error_rate": 0.0,
        "timeout_rate": 0.0,
        "decline_rate": 0.0,
        "latency_ms": 0,
        "down": False,
    }
    assert gateway.faults(error_rate=0.5, latency_ms=5)["error_rate"] == 0.5
    for bad in ({"error_rate": 1.5}, {"timeout_rate": -0.1}, {"latency_ms": -1}, {"down": "yes"}, {"nope": 1}):
        assert http.post("/_sandbox/faults", json=bad).status_code == 400, bad
    assert http.post("/_sandbox/faults", content=b"[").status_code == 400
    assert gateway.faults()["error_rate"] == 0.5  # a refused update changes nothing
    assert gateway.reset()["faults"]["error_rate"] == 0.0


def test_down_answers_503_and_records_nothing(gateway, http, key):
    gateway.faults(down=True)
    response = pay(http, key)
    assert response.status_code == 503
    assert response.json() == {"error": {"code": "unavailable", "message": "the gateway is down"}}
    gateway.faults(down=False)
    assert gateway.payouts(key)["count"] == 0


def test_error_rate_answers_5xx_before_recording(gateway, http, key):
    gateway.faults(error_rate=1)
    assert pay(http, key).status_code in (500, 503)
    assert gateway.payouts(key)["count"] == 0


def test_timeout_rate_records_the_payout_and_closes_without_an_answer(gateway, http, key):
    gateway.faults(timeout_rate=1)
    with pytest.raises(httpx.RemoteProtocolError):
        pay(http, key)
    gateway.faults(timeout_rate=0)
    assert gateway.payouts(key)["count"] == 1


def test_reset_with_data_deletes_every_payout(gateway, http, key):
    pay(http, key)
    gateway.reset(data=False)
    assert gateway.summary()["count"] == 1
    gateway.reset(data=True)
    assert gateway.summary() == {"count": 0, "declined": 0, "duplicates": []}


def test_summary_and_all_payouts(gateway, http, key):
    paid = pay(http, key).json()
    pay(http, f"{key}-d", destination="decline-1")
    assert gateway.summary() == {"count": 1, "declined": 1, "duplicates": []}
    rows = gateway.all_payouts()
    assert {row["idempotency_key"]: row["status"] for row in rows} == {key: "paid", f"{key}-d": "declined"}
    assert rows[0] == {k: paid[k] for k in ("id", "idempotency_key", "amount", "destination", "status", "created")}


def test_inject_kinds(gateway, http, key):
    injected = gateway.inject(kind="unknown_payout", amount=777, destination="acct_x")
    assert injected["idempotency_key"].startswith("inj_") and injected["status"] == "paid"
    assert gateway.payouts(injected["idempotency_key"])["count"] == 1

    pay(http, key, amount=100)
    changed = http.post("/_sandbox/inject", json={"kind": "amount", "idempotency_key": key, "amount": 90})
    assert changed.status_code == 200
    assert gateway.payouts(key)["payouts"][0]["amount"] == 90

    removed = http.post("/_sandbox/inject", json={"kind": "remove", "idempotency_key": key})
    assert removed.status_code == 200
    assert gateway.payouts(key)["payouts"] == []

    for body in (
        {"kind": "amount", "idempotency_key": "nobody", "amount": 1},
        {"kind": "remove", "idempotency_key": "x"},
    ):
        assert http.post("/_sandbox/inject", json=body).status_code == 404
    assert http.post("/_sandbox/inject", json={"kind": "what"}).status_code == 400
    assert http.post("/_sandbox/inject", json={"kind": "unknown_payout", "amount": 0}).status_code == 400


def test_other_paths_are_json_404(http):
    for method, path in (
        ("GET", "/"),
        ("GET", "/v1/nothing"),
        ("POST", "/_sandbox/nothing"),
        ("DELETE", "/v1/payouts"),
    ):
        response = http.request(method, path)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_every_answer_keeps_the_connection_alive(gateway, key):
    """Raw HTTP/1.1 on one socket: several answers, each framed by its Content-Length."""
    body = json.dumps({"amount": 5, "currency": "RBX", "destination": "acct_1"}).encode()
    requests = [
        f"POST /v1/payouts HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
        b"GET /_sandbox/faults HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/settlements/2026-01-01 HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        stream = sock.makefile("rb")
        statuses = []
        for request in requests:
            sock.sendall(request)
            status = int(stream.readline().split()[1])
            length = None
            while (line := stream.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert length is not None
            stream.read(length)
            statuses.append(status)
    assert statuses == [201, 200, 404, 200]


def test_api_key_guards_v1_but_not_the_control_paths(own_gateway, key):
    own_gateway.env["GATEWAY_API_KEY"] = "sk_test_123"
    own_gateway.start()
    with httpx.Client(base_url=own_gateway.url, timeout=10.0, trust_env=False) as http:
        assert pay(http, key).status_code == 401
        http.headers["Authorization"] = "Bearer wrong"
        assert pay(http, key).status_code == 401
        http.headers["Authorization"] = "Bearer sk_test_123"
        assert pay(http, key).status_code == 201
    assert own_gateway.payouts(key)["count"] == 1  # /_sandbox/* without the key
    assert own_gateway.faults()["down"] is False


def test_created_is_utc_now(http, key):
    created = datetime.strptime(pay(http, key).json()["created"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - created).total_seconds()) < 60
