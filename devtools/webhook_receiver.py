"""A webhook receiver, as a client of delaypay would run one: a real HTTP server process
for the end-to-end tests, the chaos run and the benchmark.

    python -m devtools.webhook_receiver --port 0 --secret whsec_... --fail-first 2 --log hooks.jsonl

* listens on 127.0.0.1 only (``--port 0``: any free port; the first line on stdout is
  ``listening on http://127.0.0.1:<port>/``);
* verifies every request with the ``standardwebhooks`` library, against any of the
  ``--secret`` values and of the lines of ``--secret-file`` (re-read when it changes, so
  a harness can add an endpoint's secret after the receiver started, or rotate it);
* answers 401 to a request no secret verifies, 500 to the first ``--fail-first`` tries of
  each ``webhook-id`` (of a ``--fail-share`` of the ids only, chosen by a hash of the id:
  a busy run retries some events, not all), and 200 after, each after ``--delay`` seconds (a slow receiver
  makes "killed mid-delivery" reliable);
* appends one JSON line per request to ``--log``: webhook_id, type, payment_id,
  recurring_id, version, verified, status, try, received_at, time (when answered);
* ``--log-bodies`` adds each verified request's parsed body to its line (``body``);
* ``GET /stats``: requests so far, requests in flight, ids seen, ids delivered.

``ReceiverProcess`` starts it as a child process; ``read_log`` and ``summarize`` read
its log. Standard library and ``standardwebhooks`` only: nothing of Django.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

MAX_BODY = 1 << 20


class Secrets:
    """The secrets a request may be signed with: fixed ones plus a file's lines."""

    def __init__(self, fixed: list[str], path: Path | None):
        self.fixed = [Webhook(s) for s in fixed]
        self.path = path
        self._mtime: float | None = None
        self._from_file: list[Webhook] = []
        self._lock = threading.Lock()

    def all(self) -> list[Webhook]:
        if self.path is None:
            return self.fixed
        with self._lock:
            try:
                mtime = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                return self.fixed
            if mtime != self._mtime:
                hooks, complete = [], True
                for line in filter(None, (line.strip() for line in self.path.read_text().splitlines())):
                    try:
                        hooks.append(Webhook(line))
                    except ValueError:  # a line being written: read the file again next time
                        complete = False
                self._from_file = hooks
                self._mtime = mtime if complete else None
            return self.fixed + self._from_file

    def verify(self, body: bytes, headers: dict[str, str]) -> tuple[dict | None, str]:
        """The parsed body if one secret verifies it, else None and why not."""
        error = "no secret configured"
        for hook in self.all():
            try:
                return hook.verify(body, headers), ""
            except WebhookVerificationError as exc:
                error = str(exc)
            except ValueError as exc:  # a malformed signature header
                error = f"malformed: {exc}"
        return None, error


class State:
    def __init__(
        self,
        *,
        secrets: Secrets,
        fail_first: int,
        delay: float,
        log_path: Path,
        log_bodies: bool = False,
        fail_share: float = 1.0,
    ):
        self.secrets, self.fail_first, self.delay, self.log_bodies = secrets, fail_first, delay, log_bodies
        self.fail_share = fail_share
        self.lock = threading.Lock()
        self.tries: Counter = Counter()
        self.delivered: set[str] = set()
        self.requests = 0
        self.inflight = 0
        self.log = open(log_path, "a", buffering=1)  # line-buffered: a reader sees whole lines
        if self.log.tell() and not log_path.read_bytes().endswith(b"\n"):
            self.log.write("\n")  # a predecessor killed mid-line: start on a line of our own

    def fails(self, webhook_id: str) -> bool:
        """Whether this id is among the share whose first tries fail."""
        return self.fail_share >= 1 or zlib.crc32(webhook_id.encode()) % 10_000 < self.fail_share * 10_000

    def write(self, entry: dict) -> None:
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self.lock:
            self.log.write(line)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the dispatcher's connection pool reuses connections
    server: "ReceiverServer"

    def log_message(self, format, *args):  # one JSON line per request is the log
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        state = self.server.state
        if self.path.rstrip("/") != "/stats":
            self._answer(404, b"not found")
            return
        with state.lock:
            stats = {
                "requests": state.requests,
                "inflight": state.inflight,
                "ids": len(state.tries),
                "delivered": len(state.delivered),
            }
        self._answer(200, json.dumps(stats).encode(), "application/json")

    def do_POST(self):
        state = self.server.state
        received_at = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, MAX_BODY))
        headers = {k.lower(): v for k, v in self.headers.items()}
        webhook_id = headers.get("webhook-id", "")
        with state.lock:
            state.requests += 1
            state.inflight += 1
        try:
            # A sender that gave up mid-body (its timeout, a killed dispatcher) leaves fewer
            # bytes than announced: not a bad signature, a request that never arrived whole.
            incomplete = len(body) < min(length, MAX_BODY)
            if incomplete:
                payload, error = None, f"incomplete body: {len(body)} of {length} bytes"
            else:
                payload, error = state.secrets.verify(body, headers)
            with state.lock:
                state.tries[webhook_id] += 1
                attempt = state.tries[webhook_id]
            if incomplete:
                status = 400
            elif payload is None:
                status = 401
            elif attempt <= state.fail_first and state.fails(webhook_id):
                status = 500
            else:
                status = 200
            if state.delay:
                time.sleep(state.delay)
            data = (payload or {}).get("data") or {}
            entry = {
                "webhook_id": webhook_id,
                "type": (payload or {}).get("type"),
                "payment_id": data.get("payment_id"),
                "recurring_id": data.get("recurring_id"),
                "version": data.get("version"),
                "verified": payload is not None,
                "incomplete": incomplete,
                "status": status,
                "try": attempt,
                "signatures": len(headers.get("webhook-signature", "").split()),
                "path": self.path,
                "received_at": round(received_at, 6),
                "time": round(time.time(), 6),
            }
            if error:
                entry["error"] = error
            if state.log_bodies and payload is not None:
                entry["body"] = payload
            if payload is not None and 200 <= status < 300:
                with state.lock:
                    state.delivered.add(webhook_id)
            state.write(entry)
            self._answer(status, b"ok" if status == 200 else b"try again" if status == 500 else error.encode())
        finally:
            with state.lock:
                state.inflight -= 1


class ReceiverServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The dispatcher opens up to DELAYPAY_WEBHOOK_DELIVERY_THREADS connections at once (more
    # while two dispatches overlap): the default listen backlog of 5 made some of them fail
    # with "Connection reset by peer", a fault of the receiver the bench is not measuring.
    request_queue_size = 128

    def __init__(self, port: int, state: State):
        super().__init__(("127.0.0.1", port), Handler)
        self.state = state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--secret", action="append", default=[], help="an endpoint secret (whsec_...); repeatable")
    parser.add_argument("--secret-file", type=Path, help="more secrets, one a line, re-read when it changes")
    parser.add_argument("--fail-first", type=int, default=0, help="answer 500 to the first N tries of each id")
    parser.add_argument("--fail-share", type=float, default=1.0, help="share of ids --fail-first applies to (1)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before every answer")
    parser.add_argument("--log", type=Path, required=True, help="append one JSON line per request here")
    parser.add_argument("--log-bodies", action="store_true", help="add each verified body to its log line")
    args = parser.parse_args(argv)
    if not args.secret and args.secret_file is None:
        parser.error("give --secret or --secret-file")
    state = State(
        secrets=Secrets(args.secret, args.secret_file),
        fail_first=args.fail_first,
        delay=args.delay,
        log_path=args.log,
        log_bodies=args.log_bodies,
        fail_share=args.fail_share,
    )
    server = ReceiverServer(args.port, state)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        state.log.close()


# --- for the harnesses -------------------------------------------------------------------


def read_log(path: Path) -> list[dict]:
    """Every request the receiver logged (a line a killed receiver left half written is skipped)."""
    entries = []
    try:
        with open(path) as lines:
            for line in lines:
                try:
                    entries.append(json.loads(line))
                except ValueError:  # cut short by a SIGKILL
                    continue
    except FileNotFoundError:
        pass
    return entries


@dataclass
class Summary:
    requests: int = 0
    by_id: dict[str, list[dict]] = field(default_factory=dict)  # webhook-id -> its requests, in order
    delivered: set[str] = field(default_factory=set)  # ids answered 2xx after a verified signature
    unverified: int = 0  # whole requests no secret verified
    incomplete: int = 0  # requests whose sender stopped mid-body (timed out, killed): retried
    types: Counter = field(default_factory=Counter)  # delivered ids by event type

    @property
    def all_verified(self) -> bool:
        return self.requests > 0 and self.unverified == 0

    def tries(self, webhook_id: str) -> list[int]:
        return [e["status"] for e in self.by_id.get(webhook_id, [])]


def summarize(entries: list[dict]) -> Summary:
    by_id: dict[str, list[dict]] = defaultdict(list)
    out = Summary(requests=len(entries))
    for entry in entries:
        by_id[entry["webhook_id"]].append(entry)
        if entry.get("incomplete"):
            out.incomplete += 1
        elif not entry["verified"]:
            out.unverified += 1
        elif 200 <= entry["status"] < 300 and entry["webhook_id"] not in out.delivered:
            out.delivered.add(entry["webhook_id"])
            out.types[entry["type"]] += 1
    out.by_id = dict(by_id)
    return out


class ReceiverProcess:
    """``python -m devtools.webhook_receiver`` as a child process on a free loopback port."""

    def __init__(
        self,
        *,
        log: Path,
        secrets: list[str] = (),
        secret_file: Path | None = None,
        fail_first: int = 0,
        fail_share: float = 1.0,
        delay: float = 0.0,
        port: int = 0,
        log_bodies: bool = False,
        output: Path | None = None,
    ):
        self.log_path = Path(log)
        self.args = [
            sys.executable,
            "-m",
            "devtools.webhook_receiver",
            "--port",
            str(port),
            "--log",
            str(self.log_path),
            "--fail-first",
            str(fail_first),
            "--fail-share",
            str(fail_share),
            "--delay",
            str(delay),
        ]
        for secret in secrets:
            self.args += ["--secret", secret]
        if secret_file is not None:
            self.args += ["--secret-file", str(secret_file)]
        if log_bodies:
            self.args.append("--log-bodies")
        self.secret_file = secret_file
        self.output = output or self.log_path.with_suffix(".out")
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 20.0) -> "ReceiverProcess":
        """Start it (again: on the port it had, so endpoints keep their URL)."""
        if self.url:
            self.args[self.args.index("--port") + 1] = str(self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.output, "wb")
        try:
            self.proc = subprocess.Popen(
                self.args,
                cwd=Path(__file__).resolve().parent.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            first = self.output.read_text(errors="replace").split("\n", 1)
            if len(first) == 2 and first[0].startswith("listening on "):
                self.url = first[0].removeprefix("listening on ").strip()
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the webhook receiver did not start:\n{self.output.read_text(errors='replace')[-2000:]}")

    def add_secrets(self, *secrets: str) -> None:
        """Accept these secrets from now on (appended to the secret file, which the
        receiver re-reads when it changes)."""
        if self.secret_file is None:
            raise RuntimeError("started without a secret file")
        with open(self.secret_file, "a") as lines:
            lines.write("".join(f"{secret}\n" for secret in secrets))

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])

    def stats(self) -> dict:
        # Our own receiver's loopback http URL (bandit B310: urlopen of a URL).
        with urllib.request.urlopen(f"{self.url}stats", timeout=5) as response:  # nosec B310
            return json.loads(response.read())

    def entries(self) -> list[dict]:
        return read_log(self.log_path)

    def summary(self) -> Summary:
        return summarize(self.entries())

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: requests in flight are cut, nothing is flushed."""
        if self.running:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> "ReceiverProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    main()
