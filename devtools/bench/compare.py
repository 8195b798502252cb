"""Before and after: burst runs of two checkouts side by side, as a table and a chart.

    python -m devtools.bench.compare --before b1.json b2.json --after a1.json a2.json \\
        [--label "10,000 accounts"] [--chart ab.png] [--target 2.0]

Each file is the ``--json`` of one ``manage.py bench burst`` run. Printed per run:
payments/s, pgbench's rate in the same run and the ratio, the CPU a payment cost per
process kind (``cpu_seconds``), the WAL a payment and the execution lateness p99; then
the means of each side. The chart draws payments/s and the ratio of every run, before
and after, each run beside its pgbench. No database and no Django: it reads the files.
"""

import argparse
import json
from pathlib import Path
from statistics import mean

from .chart import BLUE, GREEN, GREY, _save, pyplot


def figures(run: dict) -> dict:
    """The per-run figures this comparison prints, from one run's JSON."""
    n = run.get("executed", 0) + run.get("failed", 0) or run["payments"]
    cpu = run.get("cpu_seconds") or {}
    return {
        "payments_per_s": run["payments_per_s"],
        "pgbench_tps": run["pgbench_tps"],
        "ratio": run["ratio_vs_pgbench"],
        "postgres_us": 1e6 * cpu.get("postgres", 0) / n,
        "worker_us": 1e6 * cpu.get("worker", 0) / n,
        "wal_bytes": (run.get("wal_bytes") or 0) / n,
        "lateness_p99_s": (run.get("execution_lateness_s") or {}).get("p99"),
    }


def table(before: list[dict], after: list[dict]) -> str:
    rows = ["| run | payments/s | pgbench tps | ratio | PostgreSQL / worker CPU a payment | WAL a payment | p99 |",
            "|---|---|---|---|---|---|---|"]
    for side, runs in (("before", before), ("after", after)):
        for i, f in enumerate(map(figures, runs), 1):
            rows.append(f"| {side} {i} | {f['payments_per_s']:,.0f} | {f['pgbench_tps']:,.0f} | {f['ratio']:.2f}x"
                        f" | {f['postgres_us']:.0f} / {f['worker_us']:.0f} us | {f['wal_bytes']:,.0f} B"
                        f" | {f['lateness_p99_s']} s |")
        fs = [figures(r) for r in runs]
        if fs:
            rows.append(f"| {side}, mean | {mean(f['payments_per_s'] for f in fs):,.0f}"
                        f" | {mean(f['pgbench_tps'] for f in fs):,.0f} | {mean(f['ratio'] for f in fs):.2f}x"
                        f" | {mean(f['postgres_us'] for f in fs):.0f} / {mean(f['worker_us'] for f in fs):.0f} us"
                        f" | {mean(f['wal_bytes'] for f in fs):,.0f} B | |")
    return "\n".join(rows)


def chart(before: list[dict], after: list[dict], path: Path, *, label: str = "", target: float = 2.0) -> Path:
    plt = pyplot()
    fig, (rate_ax, ratio_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    runs = [("before", i, figures(r)) for i, r in enumerate(before, 1)] + [
        ("after", i, figures(r)) for i, r in enumerate(after, 1)]
    xs = range(len(runs))
    names = [f"{side} {i}" for side, i, _ in runs]
    colors = [GREY if side == "before" else GREEN for side, _, _ in runs]
    rate_ax.bar([x - 0.2 for x in xs], [f["payments_per_s"] for _, _, f in runs], width=0.4, color=colors,
                label="delaypay payments/s")
    rate_ax.bar([x + 0.2 for x in xs], [f["pgbench_tps"] for _, _, f in runs], width=0.4, color=BLUE, alpha=0.5,
                label="pgbench tps, same run")
    rate_ax.set_xticks(list(xs), names)
    rate_ax.set_title("payments/s beside pgbench")
    rate_ax.legend(fontsize=8, loc="lower right")
    ratio_ax.bar(list(xs), [f["ratio"] for _, _, f in runs], color=colors)
    for x, (_, _, f) in zip(xs, runs, strict=True):
        ratio_ax.annotate(f"{f['ratio']:.2f}x", (x, f["ratio"]), ha="center", va="bottom", fontsize=8)
    ratio_ax.axhline(target, color=BLUE, linestyle="--", linewidth=1)
    ratio_ax.annotate(f"{target:.1f}x: the target", (len(runs) - 0.5, target), ha="right", va="bottom", fontsize=8,
                      color=BLUE)
    ratio_ax.set_xticks(list(xs), names)
    ratio_ax.set_ylim(0, max(target, *(f["ratio"] for _, _, f in runs)) * 1.15)
    ratio_ax.set_title("ratio to pgbench")
    if label:
        fig.suptitle(label)
    return _save(plt, fig, path, rect=(0, 0, 1, 0.93) if label else (0, 0, 1, 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--chart", type=Path)
    parser.add_argument("--target", type=float, default=2.0, help="the ratio to pgbench drawn as the target (2.0)")
    args = parser.parse_args(argv)
    before = [json.loads(p.read_text()) for p in args.before]
    after = [json.loads(p.read_text()) for p in args.after]
    print(table(before, after))
    if args.chart:
        print(f"chart written to {chart(before, after, args.chart, label=args.label, target=args.target)}")


if __name__ == "__main__":
    main()
