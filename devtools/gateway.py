"""The sandbox payment gateway (rails/sandbox.py) as a child process, for the tests, the
chaos run and benchmarks, and a load check of it.

    with SandboxGateway(db_path=tmp / "gateway.sqlite3") as gateway:
        gateway.faults(timeout_rate=0.1)
        ... HttpRail(name="sandbox", base_url=gateway.url) ...
        assert gateway.summary()["duplicates"] == []

    python -m devtools.gateway load --connections 48 --seconds 10 --latency-ms 20

The load check drives POST /v1/payouts over raw keep-alive sockets from asyncio (a light
client, so that on a small machine the figure is the gateway's, not the client's).
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent
START_TIMEOUT = 15.0


def free_port() -> int:
    """A port nobody listens on at 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SandboxGatewayError(RuntimeError):
    pass


class SandboxGateway:
    """``python -m rails.sandbox`` on 127.0.0.1: started again on the same port, so a rail
    built for ``url`` reaches it across restarts. Its output goes to ``log_path`` (by
    default beside the database)."""

    def __init__(self, *, port: int | None = None, db_path: Path, log_path: Path | None = None, env=None):
        self.port = port or free_port()
        self.db_path = Path(db_path)
        self.log_path = Path(log_path) if log_path is not None else self.db_path.with_suffix(".log")
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self._client = httpx.Client(base_url=self.url, timeout=10.0, trust_env=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> "SandboxGateway":
        """Spawn it and wait until it answers GET /_sandbox/faults."""
        if self.running:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "rails.sandbox",
            "--host", "127.0.0.1", "--port", str(self.port), "--db", str(self.db_path),
        ]  # fmt: skip
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=BASE_DIR,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self._client.get("/_sandbox/faults", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise SandboxGatewayError(f"the sandbox gateway did not start:\n{self._tail()}")

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not gone within ``timeout``."""
        self._client.close()
        self._client = httpx.Client(base_url=self.url, timeout=10.0, trust_env=False)
        if not self.running:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: requests in flight are cut."""
        if self.running:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        self._client.close()

    def __enter__(self) -> "SandboxGateway":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- control calls --

    def _call(self, method: str, path: str, **kwargs) -> dict:
        response = self._client.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise SandboxGatewayError(f"{method} {path}: HTTP {response.status_code} {response.text[:500]}")
        return response.json()

    def faults(self, **changes) -> dict:
        """Set some faults (error_rate, timeout_rate, decline_rate, latency_ms, down); all of them with none."""
        if not changes:
            return self._call("GET", "/_sandbox/faults")
        return self._call("POST", "/_sandbox/faults", json=changes)

    def reset(self, data: bool = False) -> dict:
        """Faults back to zero; with ``data`` every payout deleted too."""
        return self._call("POST", "/_sandbox/reset", json={"data": data})

    def payouts(self, key: str) -> dict:
        """{"idempotency_key", "count" (paid), "declined", "payouts"} under ``key``."""
        return self._call("GET", "/_sandbox/payouts", params={"idempotency_key": key})

    def summary(self) -> dict:
        """{"count" (paid), "declined", "duplicates" (keys with more than one row)}."""
        return self._call("GET", "/_sandbox/payouts")

    def all_payouts(self) -> list[dict]:
        return self._call("GET", "/_sandbox/payouts/all")["payouts"]

    def inject(self, **request) -> dict:
        """A settlement mismatch: kind=unknown_payout|amount|remove (docs/reference/rail-contract.md)."""
        return self._call("POST", "/_sandbox/inject", json=request)


# --- load check ----------------------------------------------------------------------------


async def _drive(port: int, stream, deadline: float, counts: dict, latencies: list) -> None:
    """POST payouts on one open connection, one after the other, until ``deadline``."""
    reader, writer = stream
    body = json.dumps({"amount": 100, "currency": "RBX", "destination": "acct_load"}).encode()
    try:
        while time.monotonic() < deadline:
            request = (
                f"POST /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Idempotency-Key: load-{uuid.uuid4().hex}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            sent = time.monotonic()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.monotonic() - sent)
            counts[status] = counts.get(status, 0) + 1
    finally:
        writer.close()


async def _load(port: int, connections: int, seconds: float) -> dict:
    # Every connection open (and its server thread started) before the clock starts.
    streams = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(connections)))
    counts: dict[int, int] = {}
    latencies: list[float] = []
    began = time.monotonic()
    results = await asyncio.gather(
        *(_drive(port, stream, began + seconds, counts, latencies) for stream in streams), return_exceptions=True
    )
    elapsed = time.monotonic() - began
    errors = [repr(result) for result in results if isinstance(result, BaseException)]
    latencies.sort()
    done = sum(counts.values())

    def quantile(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else 0.0

    return {
        "connections": connections,
        "seconds": round(elapsed, 2),
        "requests": done,
        "per_second": round(done / elapsed),
        "statuses": {str(status): n for status, n in sorted(counts.items())},
        "latency_ms": {"p50": quantile(0.5), "p99": quantile(0.99), "max": quantile(1.0)},
        "connection_errors": errors[:5],
    }


def load_check(
    gateway: SandboxGateway, *, connections: int = 48, seconds: float = 10.0, latency_ms: float = 20
) -> dict:
    """POST /v1/payouts (a new key each) from ``connections`` keep-alive connections for
    ``seconds`` with ``latency_ms`` injected; returns the rate and latencies measured."""
    gateway.faults(latency_ms=latency_ms)
    try:
        return asyncio.run(_load(gateway.port, connections, seconds))
    finally:
        gateway.reset()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The sandbox gateway's load check.")
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load", help="start a gateway on a temporary database and measure POST /v1/payouts")
    load.add_argument("--connections", type=int, default=48)
    load.add_argument("--seconds", type=float, default=10.0)
    load.add_argument("--latency-ms", type=float, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sandbox-gateway-load-") as tmp:
        with SandboxGateway(db_path=Path(tmp) / "gateway.sqlite3") as gateway:
            result = load_check(gateway, connections=args.connections, seconds=args.seconds, latency_ms=args.latency_ms)
            result["rows"] = gateway.summary()["count"]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
