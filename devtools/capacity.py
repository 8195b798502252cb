"""The capacity model (docs/explanation/capacity.md): from burst runs measured here, what
seed 000's burst (83,000 payments/s, 500M pending) needs in database primaries, promoter
shards and workers, and which limit comes next.

    python -m devtools.capacity RUN.json [RUN.json ...] [--rate 83000] [--pending 500000000]

Each RUN.json is ``manage.py bench burst --json`` output (it records, over the drain, the
CPU seconds of each process kind, the WAL written and the tables' size). The model:

* per payment, CPU milliseconds of PostgreSQL (its backends plus its own background
  processes), of the workers and of the promoter, each ``a + b / batch``: a fixed part
  per payment and a part per batch (a claim, a transaction, a commit) spread over the
  batch. ``a`` and ``b`` are fitted on the runs with the fewest workers at two batch sizes;
* a machine of ``cores`` runs ``rate = cores * u / (cpu per payment, all kinds)``, where
  ``u`` is the share of the cores the calibration run (fewest workers, largest batch)
  kept busy; the other runs check that prediction (printed with its error);
* the target then needs, with ``--headroom`` of each resource used at most:
  PostgreSQL cores ``rate * db_ms`` spread over primaries of ``--primary-cores``, and
  bounded by ``--wal-mb-s`` of WAL per primary and ``--primary-disk-tb`` of storage;
  promoter processes at one core each; worker processes at the CPU one of them used here.

Assumptions the runs cannot measure (a primary's cores, its WAL bandwidth, its disk) are
options with stated defaults; change them to your hardware.
"""

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Run:
    name: str
    payments: int
    batch: int
    workers: int
    concurrency: int
    cores: int
    drain_s: float
    rate: float
    cpu_ms: dict[str, float]  # per payment: postgres, worker, promoter, other
    wal_bytes: float  # per payment
    stored_bytes: float  # per finished payment: its row, events, attempts, transfer, indexes
    pgbench_tps: float | None

    @property
    def total_ms(self) -> float:
        return sum(self.cpu_ms.values())

    @property
    def busy(self) -> float:
        """The share of the machine's cores in use during the drain."""
        return self.total_ms * self.rate / 1000 / self.cores


def load(path: Path) -> Run:
    data = json.loads(path.read_text())
    runs = data.get("runs") or [data]
    run = next(r for r in runs if r.get("scenario") in ("burst", "hot-sender"))
    n = run["payments"]
    cpu = run.get("cpu_seconds")
    if not cpu or not run.get("drain_s"):
        raise SystemExit(f"{path}: no cpu_seconds or drain_s (a bench run from before the capacity model?)")
    kinds = {"postgres": ("postgres", "postgres_background"), "worker": ("worker",), "promoter": ("promoter",)}
    cpu_ms = {kind: sum(cpu.get(k, 0.0) for k in names) * 1000 / n for kind, names in kinds.items()}
    cpu_ms["other"] = sum(v for k, v in cpu.items() if not any(k in names for names in kinds.values())) * 1000 / n
    pgbench = run.get("pgbench_tps")
    return Run(
        name=path.stem, payments=n, batch=run["knobs"]["claim_batch"], workers=run.get("workers", 1),
        concurrency=run.get("concurrency", 4), cores=run.get("cores") or 2, drain_s=run["drain_s"],
        rate=run["payments_per_s"], cpu_ms=cpu_ms, wal_bytes=run.get("wal_bytes", 0) / n,
        stored_bytes=sum((run.get("table_bytes") or {}).values()) / n, pgbench_tps=pgbench,
    )


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``cost = a + b / batch`` through two (batch, cost) points (one point: b = 0)."""
    if len({batch for batch, _ in points}) < 2:
        return sum(cost for _, cost in points) / len(points), 0.0
    (b1, c1), (b2, c2) = sorted(points)[:1] + sorted(points)[-1:]
    b = (c1 - c2) / (1 / b1 - 1 / b2)
    return c1 - b / b1, b


@dataclass(frozen=True)
class Model:
    costs: dict[str, tuple[float, float]]  # kind -> (a ms, b ms per batch)
    busy: float  # the calibration run's share of busy cores
    wal_bytes: float
    stored_bytes: float
    cores_per_worker: float  # CPU cores one worker process (its prefork children) used

    def ms(self, kind: str, batch: int) -> float:
        a, b = self.costs[kind]
        return max(0.0, a + b / batch)

    def total_ms(self, batch: int) -> float:
        return sum(self.ms(kind, batch) for kind in self.costs)

    def rate_on(self, cores: int, batch: int) -> float:
        return cores * self.busy * 1000 / self.total_ms(batch)


def build(runs: list[Run]) -> tuple[Model, list[Run]]:
    fewest = min(r.workers for r in runs)
    calibration = [r for r in runs if r.workers == fewest]
    anchor = max(calibration, key=lambda r: r.batch)
    costs = {kind: fit([(r.batch, r.cpu_ms[kind]) for r in calibration]) for kind in anchor.cpu_ms}
    cores_per_worker = anchor.cpu_ms["worker"] * anchor.rate / 1000 / anchor.workers
    model = Model(costs=costs, busy=anchor.busy, wal_bytes=anchor.wal_bytes, stored_bytes=anchor.stored_bytes,
                  cores_per_worker=cores_per_worker)
    return model, calibration


def plan(model: Model, args) -> dict:
    batch = args.batch
    db_ms, worker_ms, promoter_ms = (model.ms(k, batch) for k in ("postgres", "worker", "promoter"))
    db_cores = args.rate * db_ms / 1000 / args.headroom
    per_primary = {
        "CPU": args.primary_cores * args.headroom * 1000 / db_ms if db_ms else math.inf,
        "WAL": args.wal_mb_s * 1e6 * args.headroom / model.wal_bytes if model.wal_bytes else math.inf,
    }
    pending_bytes = args.pending * model.stored_bytes
    primaries = {
        "CPU": math.ceil(db_cores / args.primary_cores),
        "WAL": math.ceil(args.rate / per_primary["WAL"]) if per_primary["WAL"] != math.inf else 0,
        "storage": math.ceil(pending_bytes / (args.primary_disk_tb * 1e12 * args.headroom)),
    }
    promoter_rate = args.headroom * 1000 / promoter_ms if promoter_ms else math.inf
    worker_cores = args.rate * worker_ms / 1000 / args.headroom
    return {
        "batch": batch,
        "ms_per_payment": {"postgres": db_ms, "worker": worker_ms, "promoter": promoter_ms},
        "postgres_cores": db_cores,
        "primaries": primaries,
        "primaries_needed": max(primaries.values()),
        "bound_by": max(primaries, key=primaries.get),
        "per_primary_rate": per_primary,
        "next_limit": min(per_primary, key=per_primary.get),
        "pending_tb": pending_bytes / 1e12,
        "promoter_shards": math.ceil(args.rate / promoter_rate),
        "promoter_rate_each": promoter_rate,
        "worker_cores": worker_cores,
        "worker_processes": math.ceil(worker_cores / model.cores_per_worker) if model.cores_per_worker else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="manage.py bench burst --json outputs")
    parser.add_argument("--rate", type=float, default=83_000, help="payments/s to reach (seed 000: 83,000)")
    parser.add_argument("--pending", type=float, default=500e6, help="payments waiting (seed 000: 500M)")
    parser.add_argument("--batch", type=int, default=1000, help="claim batch in production (DELAYPAY_CLAIM_BATCH)")
    parser.add_argument("--headroom", type=float, default=0.7, help="share of each resource to plan to use")
    parser.add_argument("--primary-cores", type=int, default=32, help="CPU cores of one PostgreSQL primary")
    parser.add_argument("--wal-mb-s", type=float, default=200, help="WAL one primary writes and ships, MB/s")
    parser.add_argument("--primary-disk-tb", type=float, default=4, help="storage of one primary, TB")
    args = parser.parse_args(argv)

    runs = [load(path) for path in args.runs]
    model, calibration = build(runs)
    out = sys.stdout.write
    out("runs (per payment: CPU ms by process kind; WAL and storage bytes)\n")
    out(f"{'run':<28} {'workers':>7} {'batch':>5} {'rate/s':>8} {'pg ms':>6} {'wrk ms':>6} {'prom ms':>7} "
        f"{'busy':>5} {'WAL B':>6} {'disk B':>6} {'pgbench':>8}\n")
    for r in runs:
        out(f"{r.name:<28} {r.workers:>7} {r.batch:>5} {r.rate:>8,.0f} {r.cpu_ms['postgres']:>6.3f} "
            f"{r.cpu_ms['worker']:>6.3f} {r.cpu_ms['promoter']:>7.3f} {r.busy:>5.0%} {r.wal_bytes:>6,.0f} "
            f"{r.stored_bytes:>6,.0f} {r.pgbench_tps or 0:>8,.0f}\n")
    out("\nmodel: ms per payment = a + b / batch (fitted on the "
        f"{len(calibration)} run(s) with {calibration[0].workers} worker(s)); busy share {model.busy:.0%}\n")
    for kind, (a, b) in model.costs.items():
        out(f"  {kind:<9} a = {a:.4f} ms, b = {b:.3f} ms per batch\n")
    out("\ncheck: predicted rate on this machine vs measured\n")
    for r in runs:
        predicted = model.rate_on(r.cores, r.batch)
        used = " (calibration)" if r in calibration else ""
        out(f"  {r.name:<28} predicted {predicted:>8,.0f}/s  measured {r.rate:>8,.0f}/s  "
            f"error {100 * (predicted - r.rate) / r.rate:+.0f}%{used}\n")
    p = plan(model, args)
    out(f"\nfor {args.rate:,.0f} payments/s and {args.pending:,.0f} pending, batch {p['batch']}, "
        f"using at most {args.headroom:.0%} of each resource:\n")
    out(f"  PostgreSQL: {p['postgres_cores']:,.0f} cores -> primaries by CPU {p['primaries']['CPU']}, "
        f"by WAL {p['primaries']['WAL']}, by storage {p['primaries']['storage']} "
        f"({p['pending_tb']:.2f} TB pending): {p['primaries_needed']} primaries, bound by {p['bound_by']}\n")
    out(f"  one primary's ceiling: CPU {p['per_primary_rate']['CPU']:,.0f}/s, WAL {p['per_primary_rate']['WAL']:,.0f}/s"
        f" -> next limit on one primary: {p['next_limit']}\n")
    out(f"  promoter shards: {p['promoter_shards']} (one process claims {p['promoter_rate_each']:,.0f}/s)\n")
    out(f"  workers: {p['worker_cores']:,.0f} cores = {p['worker_processes']} worker processes "
        f"at {model.cores_per_worker:.2f} cores each (as measured)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
