"""Fault-injection run: crash everything while payments drain, then check every invariant."""

import secrets
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from devtools import chaos
from devtools.processes import stop_children_on_sigterm


class Command(BaseCommand):
    help = (
        "Start a private PostgreSQL cluster and redis-server, run the real workers, promoter and beat against "
        "them, drain N payments while injecting faults from a seeded RNG, converge, reconcile, and print one "
        "line of figures. Exit 1 on any lost payment, duplicated transfer, conservation error or violation, "
        "or a terminal payment without exactly one webhook event delivered to its owner's receiver."
    )

    def add_arguments(self, parser):
        d = chaos.Options()
        parser.add_argument("--payments", type=int, default=d.payments, help=f"payments to schedule ({d.payments})")
        parser.add_argument("--seed", type=int, default=None, help="RNG seed (random when omitted; always printed)")
        minimum = sum(chaos.MINIMUM_FAULTS.values())
        parser.add_argument("--faults", type=int, default=d.faults,
                            help=f"faults to inject: 0, or at least {minimum} (every kind); default {d.faults}")
        parser.add_argument("--workers", type=int, default=d.workers, help=f"worker processes ({d.workers})")
        parser.add_argument("--concurrency", type=int, default=d.concurrency,
                            help=f"prefork children per worker ({d.concurrency})")
        parser.add_argument("--window", type=float, default=d.window,
                            help=f"seconds over which payments fall due and faults land ({d.window:g})")
        parser.add_argument("--accounts", type=int, default=d.accounts, help="accounts (default payments/20)")
        parser.add_argument("--underfunded", type=float, default=d.underfunded,
                            help=f"share of underfunded accounts ({d.underfunded:g})")
        parser.add_argument("--cancel-ratio", type=float, default=d.cancel_ratio,
                            help=f"share of payments cancelled while draining ({d.cancel_ratio:g})")
        parser.add_argument("--lease", type=float, default=d.lease_seconds,
                            help=f"DELAYPAY_LEASE_SECONDS for the run ({d.lease_seconds:g})")
        parser.add_argument("--batch", type=int, default=d.batch, help=f"DELAYPAY_CLAIM_BATCH ({d.batch})")
        parser.add_argument("--inflight-cap", type=int, default=d.inflight_cap,
                            help=f"DELAYPAY_INFLIGHT_CAP ({d.inflight_cap})")
        parser.add_argument("--max-attempts", type=int, default=d.max_attempts,
                            help=f"DELAYPAY_MAX_ATTEMPTS ({d.max_attempts})")
        parser.add_argument("--broker-outage-seconds", type=float, default=d.broker_outage_seconds,
                            help=f"seconds the long_broker_outage fault keeps Redis down ({d.broker_outage_seconds:g})")
        parser.add_argument("--workers-down-leases", type=float, default=d.workers_down_leases,
                            help="add one fault: every worker stopped for this many leases from t+0.5s (0: none)")
        parser.add_argument("--converge-timeout", type=float, default=d.converge_timeout,
                            help=f"seconds to wait for every payment to be terminal ({d.converge_timeout:g})")
        parser.add_argument("--housekeeping-timeout", type=float, default=120.0,
                            help="after convergence, seconds for beat's purge to empty the start markers; "
                                 "0 skips the check (120)")
        parser.add_argument("--no-webhooks", action="store_true",
                            help="leave out the webhook receiver, the endpoints, the webhooks process and their checks")
        parser.add_argument("--webhook-fail-first", type=int, default=d.webhook_fail_first,
                            help=f"the receiver answers 500 to the first N tries of an event ({d.webhook_fail_first})")
        parser.add_argument("--webhook-fail-share", type=float, default=d.webhook_fail_share,
                            help=f"... for this share of the events ({d.webhook_fail_share:g})")
        parser.add_argument("--webhook-drain-timeout", type=float, default=d.webhook_drain_timeout,
                            help=f"seconds after convergence for every event to be delivered "
                                 f"({d.webhook_drain_timeout:g})")
        parser.add_argument("--payouts", type=float, default=d.payouts,
                            help=f"share of the payments that are payouts through the sandbox gateway, with its "
                            f"faults and checks; 0: no gateway ({d.payouts:g})")
        parser.add_argument("--gateway-outage-seconds", type=float, default=d.gateway_outage_seconds,
                            help="seconds the gateway_down fault keeps the gateway stopped "
                            f"({d.gateway_outage_seconds:g})")
        parser.add_argument("--pg-port", type=int, default=d.pg_port,
                            help=f"port of the private PostgreSQL, or the next free one ({d.pg_port})")
        parser.add_argument("--redis-port", type=int, default=d.redis_port,
                            help=f"port of the private Redis, or the next free one ({d.redis_port})")
        parser.add_argument("--cluster", default=d.cluster, help=f"name of the private cluster ({d.cluster})")
        parser.add_argument("--log-dir", default=str(d.log_dir), help=f"where process logs go ({d.log_dir})")
        parser.add_argument("--shards", type=int, default=d.shards,
                            help=f"DELAYPAY_CLAIM_SHARDS, and as many promoter processes ({d.shards})")
        parser.add_argument("--replica", action="store_true",
                            help="a streaming standby, the web process reading from it (DATABASE_REPLICA_URL) and "
                                 "an API reader through the run; adds the replica_down and replica_lag faults")
        parser.add_argument("--keep", action="store_true", help="keep the private cluster afterwards")

    def handle(self, *args, **o):
        options = chaos.Options(
            payments=o["payments"], seed=o["seed"] if o["seed"] is not None else secrets.randbelow(10**6),
            faults=o["faults"], workers=o["workers"], concurrency=o["concurrency"], window=o["window"],
            accounts=o["accounts"], underfunded=o["underfunded"], cancel_ratio=o["cancel_ratio"],
            lease_seconds=o["lease"], batch=o["batch"], inflight_cap=o["inflight_cap"],
            max_attempts=o["max_attempts"], broker_outage_seconds=o["broker_outage_seconds"],
            workers_down_leases=o["workers_down_leases"],
            converge_timeout=o["converge_timeout"], webhooks=not o["no_webhooks"],
            housekeeping_timeout=o["housekeeping_timeout"],
            webhook_fail_first=o["webhook_fail_first"], webhook_fail_share=o["webhook_fail_share"],
            webhook_drain_timeout=o["webhook_drain_timeout"],
            payouts=o["payouts"], gateway_outage_seconds=o["gateway_outage_seconds"],
            pg_port=o["pg_port"],
            redis_port=o["redis_port"], cluster=o["cluster"], log_dir=Path(o["log_dir"]), keep=o["keep"],
            shards=o["shards"], replica=o["replica"],
        )
        if not 1 <= options.shards <= 8:
            raise CommandError("--shards must be between 1 and 8")
        try:
            chaos.fault_plan(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

        stop_children_on_sigterm()  # tear down on SIGTERM as on Ctrl-C
        outcome = chaos.run(options, say=lambda text: self.stdout.write(text))
        self.stdout.write(self.style.SUCCESS(outcome.line) if outcome.ok else self.style.ERROR(outcome.line))
        if not outcome.ok:
            for name, samples in outcome.figures["reconcile"].items():
                self.stdout.write(f"  reconcile {name}: {', '.join(samples)}")
            raise CommandError(f"guarantees broken (replay: --seed {options.seed})", returncode=1)
