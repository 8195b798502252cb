"""A loopback webhook receiver for tests: an http.server in a thread on 127.0.0.1 that
records every request and answers as the test says (the end-to-end tests run a real
receiver process instead)."""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """``answer(request) -> (status, body bytes, extra headers)``; 204 by default."""

    answer: Callable[[Received], tuple[int, bytes, dict[str, str]]] = lambda r: (204, b"", {})
    requests: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the dispatcher's pooled client expects

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length))
                receiver.requests.append(request)
                status, body, headers = receiver.answer(request)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # the dispatcher opens several connections at once

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
