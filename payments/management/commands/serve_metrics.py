"""Serve this host's process metrics on a port, for hosts that run no `web`.

A worker-only host's Celery processes write their counters to PROMETHEUS_MULTIPROC_DIR
like everyone else, but no gunicorn there serves /metrics. This serves the same files
(compacting dead processes' files as /metrics does). The schedule's gauges (lag, counts,
heartbeats, queues) are global and come from `web`'s /metrics only.
"""

from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.core.management.base import BaseCommand, CommandError
from prometheus_client import make_wsgi_app

from common import prometheus


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a scrape every few seconds is not news
        pass


class Command(BaseCommand):
    help = "Serve the metrics of this host's delaypay processes (PROMETHEUS_MULTIPROC_DIR) over HTTP."

    def add_arguments(self, parser):
        # A scrape endpoint, on every interface by design (bandit B104).
        parser.add_argument("--address", default="0.0.0.0")  # nosec B104
        parser.add_argument("--port", type=int, default=9808)

    def handle(self, *args, address, port, **options):
        if not prometheus.multiprocess_dir():
            raise CommandError("PROMETHEUS_MULTIPROC_DIR is not set: there is nothing to serve.")
        server = make_server(address, port, make_wsgi_app(prometheus.registry_for_host()), handler_class=_QuietHandler)
        self.stdout.write(f"serving {prometheus.multiprocess_dir()} on http://{address}:{server.server_port}/metrics")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
