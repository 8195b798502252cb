"""The HTTP server in front of Django, as the Procfile's web line runs it: gunicorn with
delaypay/gunicorn_config.py and the delaypay.wsgi application, on 127.0.0.1 and a free
port. Requests are raw bytes over a socket, so they can be as malformed as a client can
make them; every answer is JSON in the API's one error shape (issue 14). What Django
answers itself is tested with the test client in tests/payments/api/test_http_edges.py.
"""

import json
import os
import socket
import subprocess
import time

import pytest

from devtools.processes import BASE_DIR, Stack, procfile
from payments.models import ScheduledPayment
from tests.api import payment_body
from tests.conftest import client_for
from tests.factories import UserFactory, funded_account

# One xdist worker for the module, so that its web process (module-scoped) starts once.
pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("http-server"), pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def web_command(port: int) -> str:
    """The Procfile's web line, bound to loopback instead of every interface."""
    line = procfile()["web"].strip()
    assert "-c delaypay/gunicorn_config.py" in line, line
    loopback = line.replace("--bind 0.0.0.0:${PORT:-8000}", f"--bind 127.0.0.1:{port}")
    assert loopback != line, line
    return loopback


class Response:
    def __init__(self, raw: bytes):
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split(" ", 2)[1])
        self.headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = dechunk(body)
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.status} {self.headers} {self.body[:300]!r}>"


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def exchange(port: int, request: bytes, *, timeout: float = 30.0) -> Response:
    """Send ``request`` whole, read the answer until the server closes (it always does:
    the sync worker closes every connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered before reading everything; the answer is still there to read
        raw = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            raw += chunk
    assert raw, "no answer"
    return Response(raw)


def chunked(body: bytes, size: int = 7) -> bytes:
    """``body`` in chunks of ``size`` bytes, with the last-chunk."""
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def assert_error(response: Response, status: int, code: str) -> dict:
    assert response.status == status, response
    assert response.headers["content-type"].startswith("application/json"), response
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["detail"], str) and body["detail"], body
    return body


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker, tmp_path_factory):
    """The Procfile's web process (one worker) against the test database; its port."""
    port = free_port()
    logs = tmp_path_factory.mktemp("web")
    with django_db_blocker.unblock():
        env = Stack(logs).env  # DATABASE_URL of the test database, REDIS_URL, PATH
    env = {
        **env,
        "WEB_CONCURRENCY": "1",
        "PROMETHEUS_MULTIPROC_DIR": str(logs / "metrics"),
    }
    os.makedirs(env["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
    with open(logs / "web.log", "wb") as log:
        proc = subprocess.Popen(
            ["sh", "-c", f"exec {web_command(port)}"], cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                exchange(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout=5)
                break
            except (OSError, AssertionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"web did not start:\n{(logs / 'web.log').read_text()[-4000:]}") from None
                time.sleep(0.2)
        yield port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)


def request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# --- What gunicorn refuses before Django sees it ---------------------------------------------


def test_an_over_long_request_line_is_414_json(web):
    response = exchange(web, request("GET", "/api/v1/payments?q=" + "a" * 9000))
    assert_error(response, 414, "uri_too_long")
    assert response.headers["x-content-type-options"] == "nosniff"


def test_a_70_kb_header_is_431_json(web):
    assert_error(exchange(web, request("GET", "/api/v1/payments", "X-Big: " + "b" * 70_000)), 431, "header_too_large")


def test_too_many_headers_is_431_json(web):
    headers = [f"X-H{i}: v" for i in range(150)]
    assert_error(exchange(web, request("GET", "/api/v1/payments", *headers)), 431, "header_too_large")


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /api/v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trace: a\x01b\r\n\r\n",  # a control character
        b"GET /api/v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nX Bad: v\r\n\r\n",  # a space in a header name
        b"NOT A REQUEST\r\n\r\n",
        b"GET /api/v1/payments HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /api/v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"POST /api/v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    ],
    ids=["control-character", "header-name", "request-line", "http-version", "two-lengths", "bad-chunk"],
)
def test_a_malformed_request_is_400_json(web, raw):
    assert_error(exchange(web, raw), 400, "bad_request")


def test_an_expectation_other_than_100_continue_is_417_json(web):
    response = exchange(web, request("GET", "/api/v1/payments", "Expect: teapot"))
    assert_error(response, 417, "expectation_failed")


def test_an_unknown_transfer_coding_is_501_json(web):
    response = exchange(web, request("POST", "/api/v1/payments", "Transfer-Encoding: br, chunked", body=b"0\r\n\r\n"))
    assert_error(response, 501, "not_implemented")


def test_a_compressed_chunked_body_is_501_json_not_parsed_as_json(web):
    # gunicorn frames "gzip, chunked" but does not decompress: the body would be gzip bytes.
    response = exchange(
        web, request("POST", "/api/v1/payments", "Content-Type: application/json", "Transfer-Encoding: gzip, chunked",
                     body=chunked(b"\x1f\x8b\x08\x00"))
    )
    assert_error(response, 501, "not_implemented")


def test_an_error_outside_the_api_is_json_too(web):
    # Gunicorn cannot know the path is not /api/: its refusals are JSON everywhere.
    assert_error(exchange(web, request("GET", "/admin/?q=" + "a" * 9000)), 414, "uri_too_long")


# --- Chunked bodies reach Django ------------------------------------------------------------


@pytest.fixture
def caller(transactional_db):
    user = UserFactory()
    authorization = client_for(user)._credentials["HTTP_AUTHORIZATION"]
    return user, f"Authorization: {authorization}"


@pytest.mark.django_db(transaction=True)
def test_a_valid_payment_sent_chunked_is_created(web, caller):
    user, authorization = caller
    source, target = funded_account(owner=user, balance=100), funded_account()
    body = json.dumps(payment_body(source, target, amount=7)).encode()
    response = exchange(web, request(
        "POST", "/api/v1/payments", authorization, "Content-Type: application/json", "Idempotency-Key: chunked-1",
        "Transfer-Encoding: chunked", body=chunked(body),
    ))
    assert response.status == 201, response
    created = ScheduledPayment.objects.get(pk=response.json()["payment_id"])
    assert (created.amount, created.from_account_id, created.payer_id) == (7, source.id, user.id)


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_over_the_api_limit_is_413_json(web, caller, settings):
    _, authorization = caller
    body = b'{"pad": "' + b"x" * (settings.DELAYPAY_MAX_BODY_BYTES + 10) + b'"}'
    response = exchange(web, request(
        "POST", "/api/v1/payments", authorization, "Content-Type: application/json", "Idempotency-Key: chunked-2",
        "Transfer-Encoding: chunked", body=chunked(body, size=8192),
    ))
    assert_error(response, 413, "payload_too_large")
    assert not ScheduledPayment.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_empty_chunked_body_is_an_empty_body(web, caller):
    _, authorization = caller
    response = exchange(web, request(
        "POST", "/api/v1/payments", authorization, "Content-Type: application/json", "Idempotency-Key: chunked-3",
        "Transfer-Encoding: chunked", body=b"0\r\n\r\n",
    ))
    body = assert_error(response, 400, "validation_error")
    assert "amount" in body["fields"]


# --- Header merging by the real server ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_idempotency_key_headers_are_400_not_one_merged_key(web, caller):
    user, authorization = caller
    source, target = funded_account(owner=user, balance=100), funded_account()
    body = json.dumps(payment_body(source, target)).encode()
    response = exchange(web, request(
        "POST", "/api/v1/payments", authorization, "Content-Type: application/json",
        "Idempotency-Key: one", "Idempotency-Key: two", f"Content-Length: {len(body)}", body=body,
    ))
    assert_error(response, 400, "idempotency_key_repeated")
    assert not ScheduledPayment.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_wildcard_content_type_is_415_through_the_server(web, caller):
    user, authorization = caller
    body = json.dumps(payment_body(funded_account(owner=user, balance=100), funded_account())).encode()
    response = exchange(web, request(
        "POST", "/api/v1/payments", authorization, "Content-Type: */*", "Idempotency-Key: wild",
        f"Content-Length: {len(body)}", body=body,
    ))
    assert_error(response, 415, "unsupported_media_type")
