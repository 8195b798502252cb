"""``manage.py bench SCENARIO``: the due-time burst benchmark (docs/reference/benchmarks.md)."""

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from devtools.bench import report
from devtools.bench.naive import use_broker
from devtools.bench.scenarios import RUNNERS, SCENARIOS, BenchError, Options, machine
from devtools.processes import stop_children_on_sigterm
from devtools.sandbox import PrivateRedis, pick_port


class Command(BaseCommand):
    help = (
        "Benchmark delaypay on the real processes against fresh scratch databases: burst, hot-sender, "
        "steady, backlog, memory, or all of them; with pgbench and naive-Celery baselines in the same run."
    )

    def add_arguments(self, parser):
        parser.add_argument("scenario", choices=[*SCENARIOS, "payouts", "fairness", "shards", "archive", "all"])
        parser.add_argument("--payments", type=int, help="payments to load (burst/hot-sender 100000; steady "
                            "rate x duration; backlog: the large backlog, 2000000; memory: the large level, 1000000)")
        parser.add_argument("--accounts", type=int, default=10_000, help="accounts (default 10000)")
        parser.add_argument("--workers", type=int, default=1, help="Celery worker processes (Procfile `worker`)")
        parser.add_argument("--concurrency", type=int, default=4,
                            help="prefork children per worker (default 4, as the Procfile)")
        parser.add_argument("--rate", type=float, default=300.0, help="steady: payments due per second (300)")
        parser.add_argument("--duration", type=float, default=60.0, help="steady: seconds of load (60)")
        parser.add_argument("--jitter", type=int, default=0, metavar="SECONDS",
                            help="burst/hot-sender: the payers opted into jitter_seconds (0..3600): each payment is "
                                 "due uniformly in [due, due + jitter], as POST /payments draws it (default 0)")
        parser.add_argument("--json", type=Path, help="write the figures as JSON to this path")
        parser.add_argument("--chart", type=Path, help="draw a PNG chart to this path (needs matplotlib)")
        parser.add_argument("--out", type=Path, default=Path("bench-out"), help="directory for process logs")
        parser.add_argument("--lead", type=float, help="seconds between the start of loading and the due instant "
                            "(default: 8 + payments/10000; naive: also + payments/500 for publishing)")
        parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a drain (900)")
        parser.add_argument("--pgbench-seconds", type=int, default=15, help="pgbench duration (15)")
        parser.add_argument("--no-naive", action="store_true", help="skip the naive Celery baseline")
        parser.add_argument("--history", type=int, default=0, metavar="N",
                            help="burst/hot-sender/steady: first load N finished payments into the past 12 months' "
                                 "partitions and time the claim over them (0)")
        parser.add_argument("--naive-payments", type=int, help="payments for the naive drain (default "
                            "min(payments, 20000); steady: the same load)")
        parser.add_argument("--naive-budget", type=float, default=300.0,
                            help="memory: seconds of enqueueing ETA tasks before the naive side stops growing (300)")
        parser.add_argument("--naive-rss-cap-mb", type=float, default=3000.0,
                            help="memory: naive worker RSS at which it stops growing (3000 MB; the machine is shared)")
        parser.add_argument("--profile", action="store_true",
                            help="py-spy the workers during the drain (needs py-spy); summary in the JSON")
        parser.add_argument("--webhooks", action="store_true",
                            help="burst/hot-sender/steady: drain without the outbox, then again with one endpoint "
                                 "subscribed to every event, the webhooks process and a loopback receiver; report "
                                 "payments/s with and without, the delivery rate and the backlog drain time")
        parser.add_argument("--burst", type=int, default=0, metavar="N",
                            help="steady: N more payments, all due at the middle of the stream; report the stream's "
                                 "lateness apart from the burst's, and while the burst drained (0)")
        parser.add_argument("--redis-outage", type=float, default=0.0, metavar="SECONDS",
                            help="steady: kill the bench's Redis a third into the stream and start it again after "
                                 "SECONDS; report the lateness of the payments due meanwhile (0)")
        parser.add_argument("--keep", action="store_true", help="keep the scratch databases (for inspection)")
        parser.add_argument("--internal", type=int, default=20_000,
                            help="payouts: internal payments due with the payouts (20000)")
        parser.add_argument("--rail-rate", type=float, default=1000.0,
                            help="payouts: DELAYPAY_RAIL_RATE_LIMIT, payouts per second (1000)")
        parser.add_argument("--rail-latency-ms", type=int, default=20, help="payouts: the gateway's latency (20)")
        parser.add_argument("--payout-concurrency", type=int, default=4,
                            help="payouts: prefork children of the payouts process (4)")
        parser.add_argument("--rail-threads", type=int, default=16,
                            help="payouts: DELAYPAY_RAIL_CONCURRENCY, calls in flight per payouts child (16)")
        parser.add_argument("--payout-steady", type=float, metavar="RATE",
                            help="payouts: instead of the burst, RATE payouts a second due evenly for --duration "
                                 "seconds, the gateway answering at once; report how late they reached the rail")
        parser.add_argument("--rail-batch", type=int, default=200,
                            help="payouts: DELAYPAY_RAIL_CLAIM_BATCH, payouts per claim and message (200)")
        parser.add_argument("--others", type=int, default=1_000,
                            help="fairness: senders with one payment each, due with the hot sender's (1000)")
        parser.add_argument("--rounds", type=int, default=1,
                            help="fairness: pairs of drains (cap on and off), the order alternating (1)")
        parser.add_argument("--promoters", default="1,2,4",
                            help="shards: promoter processes of each drain, as many claim shards (1,2,4)")
        parser.add_argument("--cap", type=int,
                            help="fairness: DELAYPAY_CLAIM_PER_SENDER of the capped drain (default: the setting, "
                                 "or 50 when it is off); the second drain runs with 0")

    def handle(self, *args, **opts):
        stop_children_on_sigterm()  # a killed bench stops its workers, promoter and beat
        if opts["scenario"] == "payouts":
            return self._payouts(opts)
        if opts["scenario"] == "fairness":
            return self._fairness(opts)
        if opts["scenario"] == "shards":
            return self._shards(opts)
        if opts["scenario"] == "archive":
            return self._archive(opts)
        scenarios = list(SCENARIOS) if opts["scenario"] == "all" else [opts["scenario"]]
        if not 0 <= opts["jitter"] <= 3600:
            raise CommandError("--jitter must be between 0 and 3600 seconds, like jitter_seconds")
        if opts["webhooks"] and opts["scenario"] not in ("burst", "hot-sender", "steady"):
            raise CommandError("--webhooks goes with burst, hot-sender or steady")
        self._preflight(opts)
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        log_root = opts["out"] / f"{opts['scenario']}-{stamp}"
        log_root.mkdir(parents=True, exist_ok=True)
        say = lambda line: self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {line}")  # noqa: E731
        runs: dict[str, dict] = {}
        started = time.monotonic()
        context = machine()
        with PrivateRedis(port=pick_port(56380), directory=log_root) as private_redis:
            use_broker(private_redis.url)
            for scenario in scenarios:
                options = Options(
                    scenario=scenario,
                    payments=opts["payments"] if len(scenarios) == 1 else None,
                    accounts=opts["accounts"],
                    workers=opts["workers"],
                    concurrency=opts["concurrency"],
                    rate=opts["rate"],
                    duration=opts["duration"],
                    jitter=opts["jitter"],
                    lead=opts["lead"],
                    timeout=opts["timeout"],
                    pgbench_seconds=opts["pgbench_seconds"],
                    naive=not opts["no_naive"],
                    naive_payments=opts["naive_payments"],
                    naive_budget=opts["naive_budget"],
                    naive_rss_cap_mb=opts["naive_rss_cap_mb"],
                    profile=opts["profile"],
                    webhooks=opts["webhooks"],
                    history=opts["history"],
                    burst=opts["burst"],
                    redis_outage=opts["redis_outage"],
                    redis=private_redis,
                    keep=opts["keep"],
                    say=say,
                )
                log_dir = log_root / scenario
                log_dir.mkdir(parents=True, exist_ok=True)
                try:
                    run = RUNNERS[scenario](options, redis_url=private_redis.url, log_dir=log_dir)
                except BenchError as exc:
                    raise CommandError(f"{scenario}: {exc}") from exc
                if options.profile and run.get("profile_files"):
                    run["profile"] = self._profile_summary(run["profile_files"])
                runs[scenario] = run
                self.stdout.write(report.summary(run))
                if opts["chart"]:
                    self._chart(run, opts["chart"], single=len(scenarios) == 1)
        targets = report.target_results(runs)
        self.stdout.write(report.targets_table(targets))
        if len(scenarios) > 1:
            table = report.markdown(runs, targets, " ".join(sys.argv))
            self.stdout.write("== for docs/reference/benchmarks.md ==\n" + table)
        self.stdout.write(f"logs in {log_root}; {time.monotonic() - started:.0f}s in all")
        if opts["json"]:
            body = runs[scenarios[0]] if len(scenarios) == 1 else {"scenario": "all", "runs": runs}
            body = {**body, "targets": targets, "machine": context, "machine_after": machine(),
                    "started_at": stamp}
            opts["json"].parent.mkdir(parents=True, exist_ok=True)
            opts["json"].write_text(json.dumps(body, indent=2, default=str) + "\n")
            self.stdout.write(f"JSON written to {opts['json']}")
        if not all(run.get("correct") for run in runs.values()):
            raise CommandError("the correctness check failed (see 'correct' above)")

    def _own_run(self, opts: dict, scenario: str, module, options) -> None:
        """A scenario with its own module (payouts, fairness, shards): ``module.run`` in a
        private Redis, ``module.summary``, then the JSON; CommandError if it was not correct."""
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        log_root = opts["out"] / f"{scenario}-{stamp}"
        log_root.mkdir(parents=True, exist_ok=True)
        say = lambda line: self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {line}")  # noqa: E731
        with PrivateRedis(port=pick_port(56380), directory=log_root) as private_redis:
            use_broker(private_redis.url)
            result = module.run(options, redis_url=private_redis.url, log_dir=log_root,
                                run_id=stamp.replace("-", ""), say=say)
        self.stdout.write(module.summary(result))
        result = {**result, "machine": machine(), "started_at": stamp}
        if opts["json"]:
            opts["json"].parent.mkdir(parents=True, exist_ok=True)
            opts["json"].write_text(json.dumps(result, indent=2, default=str) + "\n")
            self.stdout.write(f"JSON written to {opts['json']}")
        if not result["correct"]:
            raise CommandError("the correctness check failed (see 'correct' above)")

    def _archive(self, opts: dict) -> None:
        """``bench archive``: devtools/bench/archive.py (``--history`` payments in the month)."""
        from devtools.bench import archive

        options = archive.ArchiveOptions(payments=opts["history"] or 1_000_000, accounts=opts["accounts"],
                                         keep=opts["keep"])
        self._own_run(opts, "archive", archive, options)

    def _payouts(self, opts: dict) -> None:
        """``bench payouts``: devtools/bench/payouts.py."""
        from devtools.bench import payouts

        options = payouts.PayoutOptions(
            payouts=opts["payments"] or 20_000, internal=opts["internal"], accounts=opts["accounts"],
            rate=opts["rail_rate"], latency_ms=opts["rail_latency_ms"], workers=opts["workers"],
            concurrency=opts["concurrency"], payout_concurrency=opts["payout_concurrency"],
            rail_threads=opts["rail_threads"], rail_batch=opts["rail_batch"],
            timeout=opts["timeout"], keep=opts["keep"], steady_rate=opts["payout_steady"] or 0.0,
            duration=opts["duration"],
        )
        self._own_run(opts, "payouts", payouts, options)

    def _fairness(self, opts: dict) -> None:
        """``bench fairness``: devtools/bench/fairness.py."""
        from django.conf import settings

        from devtools.bench import fairness

        cap = opts["cap"] if opts["cap"] is not None else (settings.DELAYPAY_CLAIM_PER_SENDER or 50)
        if cap < 1:
            raise CommandError("--cap must be 1 or more (the second drain runs with the cap off)")
        options = fairness.FairnessOptions(
            hot=opts["payments"] or 50_000, others=opts["others"], cap=cap, rounds=max(1, opts["rounds"]),
            workers=opts["workers"], concurrency=opts["concurrency"], lead=opts["lead"], timeout=opts["timeout"],
            keep=opts["keep"],
        )
        self._own_run(opts, "fairness", fairness, options)

    def _shards(self, opts: dict) -> None:
        """``bench shards``: devtools/bench/shards.py."""
        from devtools.bench import shards

        try:
            promoters = [int(n) for n in opts["promoters"].split(",")]
        except ValueError as exc:
            raise CommandError("--promoters is a comma-separated list of whole numbers, e.g. 1,2,4") from exc
        if not promoters or not all(1 <= n <= 16 for n in promoters):
            raise CommandError("--promoters: each between 1 and 16")
        options = shards.ShardOptions(
            payments=opts["payments"] or 100_000, accounts=opts["accounts"], promoters=promoters,
            pgbench_seconds=opts["pgbench_seconds"], lead=opts["lead"], timeout=opts["timeout"], keep=opts["keep"],
        )
        self._own_run(opts, "shards", shards, options)

    def _preflight(self, opts: dict) -> None:
        """Fail before minutes of loading, not after, when a tool the options need is missing."""
        try:
            if opts["chart"]:
                from devtools.bench.chart import pyplot

                pyplot()
            if opts["profile"]:
                from devtools.bench.profile import py_spy

                py_spy()
            from devtools.bench.rss import psutil_module

            psutil_module()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc

    def _chart(self, run: dict, path: Path, *, single: bool) -> None:
        from devtools.bench.chart import chart

        target = path if single else path.with_name(f"{path.stem}-{run['scenario']}{path.suffix or '.png'}")
        target.parent.mkdir(parents=True, exist_ok=True)
        chart(run, target)
        self.stdout.write(f"chart written to {target}")

    def _profile_summary(self, files: list[str]) -> dict:
        from devtools.bench.profile import parse_collapsed, summarize

        stacks = None
        for name in files:
            parsed = parse_collapsed(Path(name).read_text())
            stacks = parsed if stacks is None else stacks + parsed
        result = summarize(stacks or {})
        self.stdout.write(f"== where a worker's time goes ({result['task_samples']} py-spy samples inside "
                          "execute_batch, wall clock) ==")
        for label, share in result["lines"][:12]:
            self.stdout.write(f"  {share:5.1f}%  {label}")
        self.stdout.write("  -- by function, inclusive --")
        for label, share in result["inclusive"][:15]:
            self.stdout.write(f"  {share:5.1f}%  {label}")
        return result
