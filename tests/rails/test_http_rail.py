"""HttpRail against a real sandbox gateway process: every outcome of the contract."""

import contextlib
import threading
from datetime import UTC, date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rails.base import RAIL_NAMES, Declined, NotFound, Paid, SettlementReportUnavailable, Unknown
from rails.http import HttpRail
from rails.registry import close_rails, get_rail

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]


SETTLEMENT_HEADER = "id,idempotency_key,amount,currency,destination,status,created"


@contextlib.contextmanager
def _canned_server(status: int, body: bytes):
    """A loopback server that answers every request with ``status`` and ``body``."""

    class Canned(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):
            pass

        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _rail(gateway, *, timeout: float = 5.0, api_key: str = "") -> HttpRail:
    return HttpRail(name="sandbox", base_url=gateway.url, api_key=api_key, timeout=timeout, connections=8)


def test_submit_pays_and_replay_returns_the_same_reference(gateway, rail, key):
    paid = rail.submit(key=key, amount=1234, destination="acct_1", metadata={"payment": "p1"})
    assert isinstance(paid, Paid)
    assert paid.reference.startswith("po_") and (paid.amount, paid.destination) == (1234, "acct_1")
    assert paid.paid_at.tzinfo is not None and paid.paid_at.utcoffset().total_seconds() == 0
    assert rail.submit(key=key, amount=1234, destination="acct_1") == paid
    assert rail.lookup(key=key) == paid
    assert gateway.payouts(key)["count"] == 1


def test_key_reused_with_another_amount_is_unknown(gateway, rail, key):
    assert isinstance(rail.submit(key=key, amount=100, destination="acct_1"), Paid)
    outcome = rail.submit(key=key, amount=200, destination="acct_1")
    assert isinstance(outcome, Unknown) and outcome.sent is True
    assert "409" in outcome.error
    assert gateway.payouts(key)["count"] == 1


def test_magic_destination_is_declined_and_stays_declined(gateway, rail, key):
    outcome = rail.submit(key=key, amount=100, destination="decline-closed")
    assert outcome == Declined(code="account_closed", message=outcome.message)
    assert rail.submit(key=key, amount=100, destination="decline-closed").code == "account_closed"
    assert rail.lookup(key=key) == Declined(code="account_closed", message="declined (lookup)")
    assert gateway.payouts(key)["count"] == 0


def test_decline_rate_declines(gateway, rail, key):
    gateway.faults(decline_rate=1)
    outcome = rail.submit(key=key, amount=100, destination="acct_1")
    assert isinstance(outcome, Declined) and outcome.code == "do_not_honor"
    gateway.faults(decline_rate=0)
    assert isinstance(rail.submit(key=key, amount=100, destination="acct_1"), Declined)  # the key's answer stays
    assert gateway.payouts(key)["count"] == 0


def test_invalid_destination_is_declined(gateway, rail, key):
    outcome = rail.submit(key=key, amount=100, destination="not valid!")
    assert isinstance(outcome, Declined) and outcome.code == "invalid_request"
    assert rail.lookup(key=key) == NotFound()


def test_dropped_answer_is_unknown_sent_and_lookup_finds_the_payout(gateway, rail, key):
    gateway.faults(timeout_rate=1)
    outcome = rail.submit(key=key, amount=100, destination="acct_1")
    assert isinstance(outcome, Unknown) and outcome.sent is True
    assert "RemoteProtocolError" in outcome.error
    gateway.faults(timeout_rate=0)
    found = rail.lookup(key=key)
    assert isinstance(found, Paid) and found.amount == 100
    assert gateway.payouts(key)["count"] == 1


def test_read_timeout_is_unknown_sent(gateway, key):
    gateway.faults(latency_ms=1500)
    with _rail(gateway, timeout=0.3) as rail:
        outcome = rail.submit(key=key, amount=100, destination="acct_1")
    assert isinstance(outcome, Unknown) and outcome.sent is True
    assert "ReadTimeout" in outcome.error


def test_injected_errors_are_unknown_and_nothing_is_recorded(gateway, rail, key):
    gateway.faults(error_rate=1)
    outcome = rail.submit(key=key, amount=100, destination="acct_1")
    assert isinstance(outcome, Unknown) and outcome.sent is True
    assert isinstance(rail.lookup(key=key), Unknown)
    gateway.faults(error_rate=0)
    assert rail.lookup(key=key) == NotFound()


def test_gateway_down_is_unknown(gateway, rail, key):
    gateway.faults(down=True)
    assert isinstance(rail.submit(key=key, amount=100, destination="acct_1"), Unknown)
    assert isinstance(rail.lookup(key=key), Unknown)
    with pytest.raises(SettlementReportUnavailable):
        rail.settlement_report(day=date.today())
    gateway.faults(down=False)
    assert rail.lookup(key=key) == NotFound()


def test_lookup_of_an_unknown_key_is_not_found(rail, key):
    assert rail.lookup(key=key) == NotFound()


def test_stopped_gateway_is_unknown_not_sent(own_gateway, key):
    own_gateway.start()
    with _rail(own_gateway) as rail:
        assert isinstance(rail.submit(key=f"{key}-1", amount=100, destination="acct_1"), Paid)  # a pooled connection
        own_gateway.stop()
        outcome = rail.submit(key=key, amount=100, destination="acct_1")
        assert outcome == Unknown(error=outcome.error, sent=False)
        assert "ConnectError" in outcome.error
        lookup = rail.lookup(key=key)
        assert isinstance(lookup, Unknown) and lookup.sent is False


def test_payouts_survive_a_restart_and_a_kill(own_gateway, key):
    own_gateway.start()
    with _rail(own_gateway) as rail:
        paid = rail.submit(key=key, amount=100, destination="acct_1")
        assert isinstance(paid, Paid)
        own_gateway.faults(decline_rate=1)
        own_gateway.stop()
        own_gateway.start()
        assert own_gateway.faults()["decline_rate"] == 0.0  # faults are in memory only
        assert rail.lookup(key=key) == paid
        own_gateway.kill()
        own_gateway.start()
        assert rail.submit(key=key, amount=100, destination="acct_1") == paid
    assert own_gateway.payouts(key)["count"] == 1


def test_api_key_is_sent_as_a_bearer_token(own_gateway, key):
    own_gateway.env["GATEWAY_API_KEY"] = "sk_test_rail"
    own_gateway.start()
    with _rail(own_gateway) as without_key:
        outcome = without_key.submit(key=key, amount=100, destination="acct_1")
        assert isinstance(outcome, Unknown) and "401" in outcome.error
        assert isinstance(without_key.lookup(key=key), Unknown)
    with _rail(own_gateway, api_key="sk_test_rail") as with_key:
        assert isinstance(with_key.submit(key=key, amount=100, destination="acct_1"), Paid)
        assert "sk_test_rail" not in repr(with_key)


def test_settlement_report_lists_the_days_paid_payouts(gateway, rail, key):
    paid = [rail.submit(key=f"{key}-{n}", amount=100 + n, destination=f"acct_{n}") for n in range(3)]
    rail.submit(key=f"{key}-declined", amount=5, destination="decline-closed")
    day = paid[0].paid_at.date()
    rows = rail.settlement_report(day=day)
    expected = [p for p in paid if p.paid_at.date() == day]
    assert [(r.reference, r.key, r.amount, r.destination, r.paid_at) for r in rows] == [
        (p.reference, f"{key}-{n}", p.amount, p.destination, p.paid_at) for n, p in enumerate(paid) if p in expected
    ]
    assert all(row.paid_at.tzinfo == UTC for row in rows)
    assert f"{key}-declined" not in {row.key for row in rows}


def test_settlement_report_sees_injected_mismatches(gateway, rail, key):
    paid = rail.submit(key=key, amount=100, destination="acct_1")
    gone = rail.submit(key=f"{key}-gone", amount=50, destination="acct_1")
    injected = gateway.inject(kind="unknown_payout", amount=999, destination="acct_9")
    gateway.inject(kind="amount", idempotency_key=key, amount=90)
    gateway.inject(kind="remove", idempotency_key=f"{key}-gone")
    days = {paid.paid_at.date(), gone.paid_at.date(), date.fromisoformat(injected["created"][:10])}
    rows = {row.key: row for day in days for row in rail.settlement_report(day=day)}
    assert rows[key].amount == 90
    assert f"{key}-gone" not in rows
    assert rows[injected["idempotency_key"]].reference == injected["id"]
    assert rows[injected["idempotency_key"]].amount == 999


@pytest.mark.parametrize(
    ("status", "text", "error"),
    [
        (200, "id,amount\r\npo_1,5\r\n", "columns missing"),
        (200, f"{SETTLEMENT_HEADER}\r\npo_1,k,five,RBX,acct_1,paid,2026-01-01T00:00:00.000000Z\r\n", "ValueError"),
        (200, f"{SETTLEMENT_HEADER}\r\npo_1,k,5,RBX,acct_1,paid,2026-01-01T00:00:00\r\n", "time zone"),
        (200, f"{SETTLEMENT_HEADER}\r\npo_1,k,5,RBX\r\n", "too few"),
        (500, "oops", "HTTP 500"),
    ],
)
def test_settlement_report_of_a_broken_answer_raises(status, text, error):
    with _canned_server(status, text.encode()) as url, HttpRail(name="sandbox", base_url=url) as rail:
        with pytest.raises(SettlementReportUnavailable, match=error):
            rail.settlement_report(day=date(2026, 1, 1))


def test_stray_answers_are_unknown(key):
    with _canned_server(200, b"{}") as url, HttpRail(name="sandbox", base_url=url) as rail:
        submitted = rail.submit(key=key, amount=5, destination="acct_1")
        assert isinstance(submitted, Unknown) and submitted.sent is True
        assert isinstance(rail.lookup(key=key), Unknown)
    payout = b'{"id":"po_1","status":"paid","amount":6,"destination":"acct_1","created":"2026-01-01T00:00:00Z"}'
    with _canned_server(201, payout) as url, HttpRail(name="sandbox", base_url=url) as rail:
        mismatch = rail.submit(key=key, amount=5, destination="acct_1")
        assert isinstance(mismatch, Unknown) and "not the one asked for" in mismatch.error
    with _canned_server(429, b"slow down") as url, HttpRail(name="sandbox", base_url=url) as rail:
        assert rail.submit(key=key, amount=5, destination="acct_1") == Unknown(error="HTTP 429", sent=True)


def test_twenty_threads_submitting_one_key_make_one_payout(gateway, rail, key):
    barrier = threading.Barrier(20)
    outcomes = []
    lock = threading.Lock()

    def submit():
        barrier.wait(timeout=30)
        outcome = rail.submit(key=key, amount=100, destination="acct_1")
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 20
    assert all(isinstance(outcome, Paid) for outcome in outcomes), outcomes
    assert len({outcome.reference for outcome in outcomes}) == 1
    assert gateway.payouts(key)["count"] == 1
    assert gateway.summary()["duplicates"] == []


def test_get_rail_builds_one_cached_rail_from_settings(settings, gateway, key):
    settings.DELAYPAY_RAIL_SANDBOX_URL = gateway.url
    settings.DELAYPAY_RAIL_SANDBOX_API_KEY = ""
    assert RAIL_NAMES == ("sandbox",)
    rail = get_rail("sandbox")
    assert rail is get_rail("sandbox") and rail.name == "sandbox"
    assert isinstance(rail.submit(key=key, amount=100, destination="acct_1"), Paid)
    close_rails()
    assert get_rail("sandbox") is not rail
    with pytest.raises(ValueError, match="unknown rail 'nope'"):
        get_rail("nope")
