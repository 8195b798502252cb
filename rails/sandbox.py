"""The sandbox payment gateway: a stand-alone process speaking the rail contract
(docs/reference/rail-contract.md), with faults to inject and counters to check.

    python -m rails.sandbox --host 127.0.0.1 --port 8090 --db var/sandbox-gateway.sqlite3

Standard library only (it never imports Django). Payouts live in a SQLite file (WAL,
synchronous=NORMAL: a killed process loses nothing committed), so they survive a restart;
faults live in memory and start at zero. Idempotency is the application's logic, as at a
real gateway: under one process-wide lock, look the key up and insert only when it has
no row. The index on the key is not unique, so a broken promise would show up as a
second row (``GET /_sandbox/payouts`` lists such keys as duplicates) instead of an error.
"""

import argparse
import csv
import io
import json
import os
import random
import re
import secrets
import signal
import sqlite3
import sys
import threading
import time
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

CURRENCY = "RBX"
DESTINATION_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
SETTLEMENT_DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MAX_KEY_LENGTH = 255
MAX_AMOUNT = 2**63 - 1  # SQLite's INTEGER
MAX_BODY = 1024 * 1024
MAGIC_DECLINE_PREFIX = "decline"
SETTLEMENT_COLUMNS = ("id", "idempotency_key", "amount", "currency", "destination", "status", "created")
FAULT_RATES = ("error_rate", "timeout_rate", "decline_rate")
IDLE_CONNECTION_SECONDS = 120  # a keep-alive connection silent this long is closed (its thread ends)

SCHEMA = """
CREATE TABLE IF NOT EXISTS payouts (
    id TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    amount INTEGER,
    currency TEXT,
    destination TEXT,
    status TEXT CHECK (status IN ('paid', 'declined')),
    decline_code TEXT,
    created TEXT
);
CREATE INDEX IF NOT EXISTS payouts_idempotency_key ON payouts (idempotency_key);
CREATE INDEX IF NOT EXISTS payouts_created ON payouts (created);
"""
# Every statement the gateway runs, by what it does (the columns in payout_object's order).
SELECT_BY_KEY = """
SELECT id, idempotency_key, amount, currency, destination, status, decline_code, created
FROM payouts WHERE idempotency_key = ? ORDER BY created, id
"""
INSERT_PAYOUT = """
INSERT INTO payouts (id, idempotency_key, amount, currency, destination, status, decline_code, created)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""
# created is 'YYYY-MM-DDTHH:MM:SS.ffffffZ': one day is the range [day, day || 'T99').
SELECT_PAID_BETWEEN = """
SELECT id, idempotency_key, amount, currency, destination, status, decline_code, created
FROM payouts WHERE status = 'paid' AND created >= ? AND created < ? ORDER BY created, id
"""
COUNT_BY_STATUS = """
SELECT count(*) FILTER (WHERE status = 'paid'), count(*) FILTER (WHERE status = 'declined') FROM payouts
"""
SELECT_DUPLICATE_KEYS = """
SELECT idempotency_key FROM payouts GROUP BY idempotency_key HAVING count(*) > 1 ORDER BY idempotency_key
"""
SELECT_ALL = "SELECT id, idempotency_key, amount, destination, status, created FROM payouts ORDER BY created, id"
UPDATE_AMOUNT = "UPDATE payouts SET amount = ? WHERE idempotency_key = ?"
DELETE_BY_KEY = "DELETE FROM payouts WHERE idempotency_key = ?"
DELETE_ALL = "DELETE FROM payouts"


class BadRequest(Exception):
    """A request the contract refuses (answered 400, nothing recorded)."""


def now_iso() -> str:
    """The current UTC time as the gateway writes it: ISO 8601, microseconds, 'Z'."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_payout_id() -> str:
    return f"po_{secrets.token_hex(12)}"


def payout_object(row: tuple) -> dict:
    id_, key, amount, currency, destination, status, decline_code, created = row
    payout = {
        "id": id_,
        "object": "payout",
        "status": status,
        "amount": amount,
        "currency": currency,
        "destination": destination,
        "idempotency_key": key,
        "created": created,
    }
    if status == "declined":
        payout["decline_code"] = decline_code
    return payout


def declined_body(payout: dict) -> dict:
    return {
        "error": {
            "code": "payout_declined",
            "decline_code": payout["decline_code"],
            "message": "The payout was declined by the receiving bank.",
        },
        "payout": payout,
    }


# --- storage -----------------------------------------------------------------------------


class Store:
    """The payouts table behind one connection and one lock: every statement is
    microseconds, and the lock is also what makes look-up-then-insert atomic."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def _rows(self, key: str) -> list[tuple]:
        return self.db.execute(SELECT_BY_KEY, (key,)).fetchall()

    def _insert(self, row: tuple) -> None:
        self.db.execute(INSERT_PAYOUT, row)

    def create_or_replay(self, *, key: str, amount: int, destination: str, decide) -> tuple[str, dict]:
        """('new', payout), ('replay', payout) or ('reused', first payout). ``decide()``
        is called for a new key only and gives the decline code (None: paid)."""
        with self.lock:
            rows = self._rows(key)
            if rows:
                first = payout_object(rows[0])
                if first["amount"] != amount or first["destination"] != destination:
                    return "reused", first
                return "replay", first
            decline_code = decide()
            row = (
                new_payout_id(),
                key,
                amount,
                CURRENCY,
                destination,
                "declined" if decline_code else "paid",
                decline_code,
                now_iso(),
            )
            self._insert(row)
            return "new", payout_object(row)

    def by_key(self, key: str) -> list[dict]:
        with self.lock:
            return [payout_object(row) for row in self._rows(key)]

    def paid_on(self, day: date) -> list[dict]:
        with self.lock:
            rows = self.db.execute(SELECT_PAID_BETWEEN, (day.isoformat(), f"{day.isoformat()}T99")).fetchall()
        return [payout_object(row) for row in rows]

    def summary(self) -> dict:
        with self.lock:
            paid, declined = self.db.execute(COUNT_BY_STATUS).fetchone()
            duplicates = [key for (key,) in self.db.execute(SELECT_DUPLICATE_KEYS)]
        return {"count": paid, "declined": declined, "duplicates": duplicates}

    def all(self) -> list[dict]:
        with self.lock:
            rows = self.db.execute(SELECT_ALL).fetchall()
        keys = ("id", "idempotency_key", "amount", "destination", "status", "created")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def inject_paid(self, *, amount: int, destination: str) -> dict:
        row = (new_payout_id(), f"inj_{secrets.token_hex(8)}", amount, CURRENCY, destination, "paid", None, now_iso())
        with self.lock:
            self._insert(row)
        return payout_object(row)

    def set_amount(self, *, key: str, amount: int) -> int:
        with self.lock:
            return self.db.execute(UPDATE_AMOUNT, (amount, key)).rowcount

    def remove(self, *, key: str) -> int:
        with self.lock:
            return self.db.execute(DELETE_BY_KEY, (key,)).rowcount

    def delete_all(self) -> None:
        with self.lock:
            self.db.execute(DELETE_ALL)


# --- faults ------------------------------------------------------------------------------


class Faults:
    def __init__(self):
        self.lock = threading.Lock()
        self.values = self.zero()

    @staticmethod
    def zero() -> dict:
        return {"error_rate": 0.0, "timeout_rate": 0.0, "decline_rate": 0.0, "latency_ms": 0, "down": False}

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.values)

    def update(self, changes: object) -> dict:
        """Apply a partial update, all or nothing; raises BadRequest naming the bad field."""
        if not isinstance(changes, dict):
            raise BadRequest("the body must be a JSON object")
        clean = {}
        for name, value in changes.items():
            if name in FAULT_RATES:
                if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                    raise BadRequest(f"{name} must be a number from 0 to 1")
                clean[name] = float(value)
            elif name == "latency_ms":
                if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 600_000:
                    raise BadRequest("latency_ms must be a number from 0 to 600000")
                clean[name] = value
            elif name == "down":
                if not isinstance(value, bool):
                    raise BadRequest("down must be true or false")
                clean[name] = value
            else:
                raise BadRequest(f"unknown fault {name!r}")
        with self.lock:
            self.values.update(clean)
            return dict(self.values)

    def reset(self) -> dict:
        with self.lock:
            self.values = self.zero()
            return dict(self.values)


# --- validation --------------------------------------------------------------------------


def valid_amount(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_AMOUNT:
        raise BadRequest("amount must be a positive integer")
    return value


def valid_destination(value: object) -> str:
    if not isinstance(value, str) or not DESTINATION_RE.fullmatch(value):
        raise BadRequest("destination must be 1 to 64 characters of A-Z a-z 0-9 _ . : -")
    return value


def valid_key(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_LENGTH:
        raise BadRequest(f"idempotency key must be 1 to {MAX_KEY_LENGTH} characters")
    return value


# --- HTTP --------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a rail's connection pool reuses connections
    server_version = "delaypay-sandbox-gateway/1"
    # Headers and body leave in one write (handle_one_request flushes after the method):
    # no small-packet interplay between Nagle and delayed ACKs on keep-alive connections.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    timeout = IDLE_CONNECTION_SECONDS
    server: "GatewayServer"

    def log_message(self, format, *args):  # quiet: no line per request
        pass

    def version_string(self) -> str:
        return self.server_version

    # -- answers --

    def _reply(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        self._reply(status, json.dumps(payload, separators=(",", ":")).encode(), "application/json", headers)

    def _error(self, status: int, code: str, message: str | None = None) -> None:
        error = {"code": code}
        if message:
            error["message"] = message
        self._json(status, {"error": error})

    def _drop(self) -> None:
        """Close the connection without a byte of answer: the client cannot know what happened."""
        self.close_connection = True

    # -- request parts --

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # not read: the rest of the stream cannot be trusted
            raise BadRequest("chunked bodies are not supported; send Content-Length")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise BadRequest("bad Content-Length") from None
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            raise BadRequest("body too large")
        return self.rfile.read(length) if length else b""

    def _json_body(self, *, required: bool = True) -> object:
        body = self._body()
        if not body and not required:
            return {}
        try:
            return json.loads(body)
        except ValueError:
            raise BadRequest("the body is not valid JSON") from None

    # -- dispatch --

    def do_GET(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    def do_PUT(self):
        self._dispatch()

    def do_PATCH(self):
        self._dispatch()

    def do_DELETE(self):
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            parts = urlsplit(self.path)
            self.route, self.query = parts.path, parse_qs(parts.query)
            if self.route.startswith("/v1/"):
                self._api()
            elif self.route.startswith("/_sandbox/"):
                self._control()
            else:
                self._body()
                self._error(404, "not_found", "no such path")
        except BadRequest as exc:
            self._error(400, "invalid_request", str(exc))

    def _param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    # -- /v1/* --

    def _api(self) -> None:
        state = self.server
        faults = state.faults.snapshot()
        if faults["down"]:
            self.close_connection = True  # the body (if any) is left unread
            self._error(503, "unavailable", "the gateway is down")
            return
        body = self._body()  # read before any answer, so the connection stays usable
        if faults["latency_ms"]:
            time.sleep(faults["latency_ms"] / 1000)
        if faults["error_rate"] and random.random() < faults["error_rate"]:
            status = random.choice((500, 503))
            self._error(status, "internal_error" if status == 500 else "unavailable", "injected error")
            return
        if state.api_key and not secrets.compare_digest(
            self.headers.get("Authorization", "").encode(), f"Bearer {state.api_key}".encode()
        ):
            self._error(401, "unauthorized", "a valid API key is required")
            return
        if self.route == "/v1/payouts" and self.command == "POST":
            self._create_payout(body, faults)
        elif self.route == "/v1/payouts" and self.command == "GET":
            key = self._param("idempotency_key")
            if key is None:
                raise BadRequest("idempotency_key is required")
            self._json(200, {"object": "list", "data": state.store.by_key(valid_key(key))})
        elif self.route.startswith("/v1/settlements/") and self.command == "GET":
            self._settlement(self.route.removeprefix("/v1/settlements/"))
        else:
            self._error(404, "not_found", "no such path")

    def _create_payout(self, body: bytes, faults: dict) -> None:
        key = self.headers.get("Idempotency-Key")
        if key is None:
            raise BadRequest("the Idempotency-Key header is required")
        key = valid_key(key)
        try:
            request = json.loads(body)
        except ValueError:
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(request, dict):
            raise BadRequest("the body must be a JSON object")
        amount = valid_amount(request.get("amount"))
        if request.get("currency") != CURRENCY:
            raise BadRequest(f"currency must be {CURRENCY}")
        destination = valid_destination(request.get("destination"))
        if not isinstance(request.get("metadata", {}), dict):
            raise BadRequest("metadata must be an object")

        def decide() -> str | None:
            if destination.startswith(MAGIC_DECLINE_PREFIX):
                return "account_closed"
            if faults["decline_rate"] and random.random() < faults["decline_rate"]:
                return "do_not_honor"
            return None

        outcome, payout = self.server.store.create_or_replay(
            key=key, amount=amount, destination=destination, decide=decide
        )
        if faults["timeout_rate"] and random.random() < faults["timeout_rate"]:
            self._drop()  # recorded (or replayed), but the client never hears of it
            return
        if outcome == "reused":
            self._error(409, "idempotency_key_reused", "the key was used with another amount or destination")
            return
        replayed = {"Idempotent-Replayed": "true"} if outcome == "replay" else None
        if payout["status"] == "declined":
            self._json(402, declined_body(payout), replayed)
        else:
            self._json(201 if outcome == "new" else 200, payout, replayed)

    def _settlement(self, text: str) -> None:
        try:
            if not SETTLEMENT_DAY_RE.fullmatch(text):
                raise ValueError(text)
            day = date.fromisoformat(text)
        except ValueError:
            raise BadRequest("the day must be YYYY-MM-DD") from None
        out = io.StringIO(newline="")
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(SETTLEMENT_COLUMNS)
        for payout in self.server.store.paid_on(day):
            writer.writerow([payout[column] for column in SETTLEMENT_COLUMNS])
        self._reply(200, out.getvalue().encode(), "text/csv; charset=utf-8")

    # -- /_sandbox/* --

    def _control(self) -> None:
        state, route, method = self.server, self.route.rstrip("/"), self.command
        if route == "/_sandbox/faults" and method == "GET":
            self._json(200, state.faults.snapshot())
        elif route == "/_sandbox/faults" and method == "POST":
            self._json(200, state.faults.update(self._json_body()))
        elif route == "/_sandbox/reset" and method == "POST":
            request = self._json_body(required=False)
            data = request.get("data", False) if isinstance(request, dict) else None
            if not isinstance(data, bool):
                raise BadRequest("data must be true or false")
            faults = state.faults.reset()
            if data:
                state.store.delete_all()
            self._json(200, {"faults": faults, "data_deleted": data})
        elif route == "/_sandbox/payouts" and method == "GET":
            key = self._param("idempotency_key")
            if key is None:
                self._json(200, state.store.summary())
                return
            payouts = state.store.by_key(key)
            self._json(
                200,
                {
                    "idempotency_key": key,
                    "count": sum(p["status"] == "paid" for p in payouts),
                    "declined": sum(p["status"] == "declined" for p in payouts),
                    "payouts": payouts,
                },
            )
        elif route == "/_sandbox/payouts/all" and method == "GET":
            self._json(200, {"payouts": state.store.all()})
        elif route == "/_sandbox/inject" and method == "POST":
            self._inject(self._json_body())
        else:
            self._body()
            self._error(404, "not_found", "no such path")

    def _inject(self, request: object) -> None:
        if not isinstance(request, dict):
            raise BadRequest("the body must be a JSON object")
        store, kind = self.server.store, request.get("kind")
        if kind == "unknown_payout":
            payout = store.inject_paid(
                amount=valid_amount(request.get("amount")), destination=valid_destination(request.get("destination"))
            )
            self._json(201, payout)
            return
        if kind not in ("amount", "remove"):
            raise BadRequest("kind must be unknown_payout, amount or remove")
        key = valid_key(request.get("idempotency_key"))
        if kind == "amount":
            changed = store.set_amount(key=key, amount=valid_amount(request.get("amount")))
        else:
            changed = store.remove(key=key)
        if not changed:
            self._error(404, "not_found", "no payout under this idempotency key")
            return
        self._json(200, {"kind": kind, "idempotency_key": key, "payouts": changed})


class GatewayServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # ~50 connections open at once in the benchmark

    def __init__(self, address: tuple[str, int], *, store: Store, api_key: str = ""):
        super().__init__(address, Handler)
        self.store, self.faults, self.api_key = store, Faults(), api_key

    def handle_error(self, request, client_address):
        # A client that hung up mid-request is ordinary; anything else is a bug worth a trace.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=os.environ.get("GATEWAY_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GATEWAY_PORT", "8090")))
    parser.add_argument("--db", type=Path, default=Path(os.environ.get("GATEWAY_DB", "var/sandbox-gateway.sqlite3")))
    args = parser.parse_args(argv)
    store = Store(args.db)
    server = GatewayServer((args.host, args.port), store=store, api_key=os.environ.get("GATEWAY_API_KEY", ""))

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"sandbox gateway listening on http://{host}:{port}/ (payouts in {args.db})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        store.close()


if __name__ == "__main__":
    main()
