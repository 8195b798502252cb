"""Failover under load: the primary of a pg_auto_failover cluster killed, frozen or switched
over while payments drain and API clients create (devtools/failover.py)."""

import json
import secrets
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from devtools import failover
from devtools.processes import stop_children_on_sigterm


class Command(BaseCommand):
    help = (
        "Build a pg_auto_failover cluster on loopback, run the real web, workers, promoter and beat on it with API "
        "clients creating payments throughout, and in each round kill (or freeze, or switch over) the primary "
        "while a burst drains; print one line of figures (lost, duplicated, conservation, acknowledged creates "
        "missing, RTO). Exit 1 when any is wrong."
    )

    def add_arguments(self, parser):
        d = failover.Options()
        parser.add_argument("--mode", choices=failover.MODES, default=d.mode,
                            help=f"kill: SIGKILL of the primary's node; stop: SIGSTOP for --stop-seconds; "
                                 f"switchover: a planned one; redis: Redis behind Sentinel, its master killed "
                                 f"({d.mode})")
        parser.add_argument("--payments", type=int, default=d.payments, help=f"payments per round ({d.payments})")
        parser.add_argument("--rounds", type=int, default=d.rounds, help=f"faults, one per round ({d.rounds})")
        parser.add_argument("--stop-seconds", type=float, default=d.stop_seconds,
                            help=f"how long --mode stop freezes the primary ({d.stop_seconds:g})")
        parser.add_argument("--command-deadline", type=float, default=None,
                            help="DELAYPAY_DB_COMMAND_DEADLINE_SECONDS for the processes (the product's default)")
        parser.add_argument("--window", type=float, default=d.window,
                            help=f"seconds over which a round's payments fall due ({d.window:g})")
        parser.add_argument("--clients", type=int, default=d.clients, help=f"API clients creating ({d.clients})")
        parser.add_argument("--workers", type=int, default=d.workers, help=f"worker processes ({d.workers})")
        parser.add_argument("--seed", type=int, default=None, help="RNG seed (random when omitted; printed)")
        parser.add_argument("--base-port", type=int, default=d.base_port,
                            help=f"the cluster's monitor port; the nodes take the next two ({d.base_port})")
        parser.add_argument("--dir", default=None, help="the cluster directory (kept); a new one in /tmp when omitted")
        parser.add_argument("--log-dir", default=str(d.log_dir), help=f"where process logs go ({d.log_dir})")

    def handle(self, *args, **o):
        options = failover.Options(
            mode=o["mode"], payments=o["payments"], rounds=o["rounds"], stop_seconds=o["stop_seconds"],
            window=o["window"], command_deadline=o["command_deadline"], clients=o["clients"], workers=o["workers"],
            seed=o["seed"] if o["seed"] is not None else secrets.randbelow(10**6),
            base_port=o["base_port"], directory=Path(o["dir"]) if o["dir"] else None, log_dir=Path(o["log_dir"]),
        )
        stop_children_on_sigterm()
        figures = failover.run(options, say=lambda line: self.stderr.write(line))
        self.stdout.write(failover.describe(figures))
        self.stdout.write(json.dumps(figures, default=str))
        if not figures["ok"]:
            raise CommandError("failover: FAIL")
